"""Named entries of one kind, each registered where it is defined: the environments, the policy backends and the
objective's variants (advantage estimators, reward scales, policy ratios, policy losses, loss aggregations, KL
estimators) are `Registry` objects, and the knob that chooses among them takes its allowed values from the
registry itself (agentrl.core.knobs), so a name lives in one place.

    ESTIMATORS = Registry("advantage estimator", field="rl.adv_estimator", module="agentrl.rl.objectives")

    @ESTIMATORS.register("grpo")
    def group_mean_baseline(r): ...

`module` is where the built-in entries register themselves: it is imported the first time the registry is asked for
an entry or its names. `builtin` maps the names of entries that live in modules of their own (a backend, an
environment) to those modules, imported only when that entry is used, so a stage imports only what it uses; a stage
names the entries it uses in a module-level `USES` (agentrl.tracking.closure adds their modules to its code).
An entry registered from anywhere else (a test, a user's module) joins the same names.
"""
from __future__ import annotations

import importlib

from agentrl.core.knobs import ConfigError


class Registry:
    def __init__(self, kind: str, field: str | None = None, module: str | None = None,
                 builtin: dict[str, str] | None = None, hint: str = ""):
        self.kind, self.field, self.module, self.hint = kind, field or kind, module, hint
        self.builtin = dict(builtin or {})
        self._entries: dict[str, object] = {}
        self._meta: dict[str, dict] = {}

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

    def _load_module(self) -> None:
        if self.module is not None:
            importlib.import_module(self.module)

    def names(self) -> tuple[str, ...]:
        """Every name, in registration order (declared built-ins first)."""
        self._load_module()
        return tuple(dict.fromkeys([*self.builtin, *self._entries]))

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self.names()

    def get(self, name: str):
        """The entry `name`, importing its module on first use; an unknown name is one line naming the field and
        the allowed names."""
        self._load_module()
        if name not in self._entries and name in self.builtin:
            importlib.import_module(self.builtin[name])
        if name not in self._entries:
            allowed = ", ".join(self.names())
            if name in self.builtin:
                raise ConfigError(f"{self.field}: {self.builtin[name]} did not register {name!r}")
            raise ConfigError(f"{self.field}: unknown value {name!r}{self.hint}; allowed: {allowed}")
        return self._entries[name]

    __getitem__ = get

    def meta(self, name: str) -> dict:
        self.get(name)
        return self._meta[name]

    def items(self) -> list[tuple[str, object]]:
        return [(name, self.get(name)) for name in self.names()]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
