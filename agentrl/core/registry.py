"""Named entries of one kind, each registered where it is defined: the environments, the policy backends, the kernel
sets, the benches and the objective's and the loop's variants are `Registry` objects. A knob whose allowed values
are a registry's names takes the registry itself as its choices (agentrl.core.knobs), so a name lives only in its
registration.

    ADV_ESTIMATORS = Registry("advantage estimator", field="rl.adv_estimator")    # agentrl.core.variants

    @ADV_ESTIMATORS.register("grpo", reference=...)                              # agentrl.rl.objectives
    def group_mean_baseline(r): ...

A registry knows only what has registered into it: the package that implements the entries registers them when it
is imported, so the code that uses a registry (a stage script, a CLI verb) imports what it uses. `builtin` maps the
names of entries that live in modules of their own (a backend, an environment, a bench) to those modules, declared
by the package that owns them and imported only when that entry is looked up by name: a process that never names
an entry never imports it. An entry registered from anywhere else (a test, a user's module) joins the same names.
"""
from __future__ import annotations

import importlib

from agentrl.core.knobs import ConfigError


class Registry:
    def __init__(self, kind: str, field: str | None = None, builtin: dict[str, str] | None = None, hint: str = ""):
        self.kind, self.field, self.hint = kind, field or kind, hint
        self.builtin: dict[str, str] = {}
        self._entries: dict[str, object] = {}
        self._meta: dict[str, dict] = {}
        self.declare(builtin or {})

    def declare(self, builtin: dict[str, str]) -> None:
        """Entries that live in modules of their own, name -> module, imported on first lookup of that name."""
        self.builtin.update(builtin)

    def register(self, name: str, entry=None, **meta):
        """Register `entry` under `name` (as a decorator when entry is omitted); `meta` travels with it. A name
        registered twice is refused (a second definition would silently win)."""
        def add(obj):
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self.kind}: a name is a non-empty string, got {name!r}")
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name], self._meta[name] = obj, meta
            return obj
        return add if entry is None else add(entry)

    def unregister(self, name: str) -> None:
        """Remove an entry registered at run time (a test's); built-in names stay declared."""
        self._entries.pop(name, None)
        self._meta.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """Every name, in registration order (declared built-ins first)."""
        return tuple(dict.fromkeys([*self.builtin, *self._entries]))

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self.names()

    def get(self, name: str):
        """The entry `name`, importing its module on first use; an unknown name is one line naming the field and
        the allowed names (or saying that nothing is registered in this process)."""
        if name not in self._entries and name in self.builtin:
            importlib.import_module(self.builtin[name])
        if name not in self._entries:
            if name in self.builtin:
                raise ConfigError(f"{self.field}: {self.builtin[name]} did not register {name!r}")
            if not self.names():
                raise ConfigError(f"{self.field}: no {self.kind} is registered in this process (the package that "
                                  "implements them is not imported)")
            raise ConfigError(f"{self.field}: unknown value {name!r}{self.hint}; allowed: {', '.join(self.names())}")
        return self._entries[name]

    __getitem__ = get

    def meta(self, name: str) -> dict:
        self.get(name)
        return self._meta[name]

    def items(self) -> list[tuple[str, object]]:
        return [(name, self.get(name)) for name in self.names()]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
