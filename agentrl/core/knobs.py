"""Declaring and checking a config field: `knob(default, type, doc, range or allowed values)`, the `Spec` it
carries, `validate` (every field of a config object by its Spec) and `Section` (a validated params section), plus
the errors a user can fix. agentrl.core.config declares the pipeline's knobs with these.
"""
from __future__ import annotations

import copy
import math
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields


class UserError(ValueError):
    """A problem the user can fix (bad params, missing or corrupted artifact): reported in one line."""


class ConfigError(UserError):
    """A bad configuration value; the message names the field and the allowed values."""


class ParamsError(UserError):
    """A params.yaml problem; str() is one line naming the file and the field."""


class Diverged(UserError):
    """Training left the range a healthy run stays in (non-finite loss or gradient, or a guard's limit): the run
    stops with one line saying where, and a replay bundle."""


# ---------------------------------------------------------------- declaring and checking a field

_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Spec:
    kind: type                      # int, float, bool, str, list or dict (a mapping, checked by its section)
    lo: float | None = None         # bounds (numbers; for lists: of each item)
    hi: float | None = None
    lo_open: bool = False           # lo < v instead of lo <= v
    hi_open: bool = False
    choices: tuple | None = None    # allowed values (str fields; for lists: of each item), or a registry whose
                                    # names they are (agentrl.core.variants), read when the field is checked
    item: type | None = None        # item type of a list
    nonempty: bool = False          # lists: at least one item
    unique: bool = False            # lists: no repeats
    nullable: bool = False          # null (None) is allowed too: "not set", the knob's doc says what that means

    @property
    def lazy(self) -> bool:
        """The allowed values are a registry's names: those registered in this process when the field is checked."""
        return self.choices is not None and not isinstance(self.choices, tuple)

    def allowed(self) -> tuple | None:
        return tuple(self.choices) if self.lazy else self.choices

    def describe(self) -> str:
        text = self._describe()
        return text + " or null" if self.nullable else text

    def _describe(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.kind is dict:
            return "a " + ("non-empty " if self.nonempty else "") + "mapping"
        if self.kind is list:
            what = self._scalar(self.item)
            noun, sep, bounds = what.split(" ", 1)[1].partition(" ")   # "an integer >= 0" -> integers >= 0
            text = f"a {'non-empty ' if self.nonempty else ''}list of {'distinct ' if self.unique else ''}" + \
                   (f"values from {', '.join(map(str, self.allowed()))}" if self.choices else f"{noun}s{sep}{bounds}")
            return text
        if self.choices:
            return "one of " + ", ".join(map(str, self.allowed()))
        return self._scalar(self.kind)

    def _scalar(self, kind) -> str:
        base = "an integer" if kind is int else "a finite number" if kind is float else "a string"
        num = (lambda v: str(int(v))) if kind is int else (lambda v: f"{v:g}")   # a 64-bit bound stays exact
        bounds = []
        if self.lo is not None:
            bounds.append(f"{'>' if self.lo_open else '>='} {num(self.lo)}")
        if self.hi is not None:
            bounds.append(f"{'<' if self.hi_open else '<='} {num(self.hi)}")
        if len(bounds) == 2 and self.lo is not None and self.hi is not None:
            lb, rb = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"{base} in {lb}{num(self.lo)}, {num(self.hi)}{rb}"
        return base + (" " + " and ".join(bounds) if bounds else "")

    def coerce(self, value):
        """The value as the declared type, or raise ValueError (the caller names the field)."""
        if value is None and self.nullable:
            return None
        if self.kind is dict:
            if not isinstance(value, dict) or (self.nonempty and not value):
                raise ValueError
            return value
        if self.kind is list:
            if not isinstance(value, list) or (self.nonempty and not value):
                raise ValueError
            items = [self._scalar_value(self.item, v) for v in value]
            if self.unique and len(set(items)) != len(items):
                raise ValueError
            return items
        return self._scalar_value(self.kind, value)

    def _scalar_value(self, kind, value):
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind is str:
            if not isinstance(value, str) or (self.choices is not None and value not in self.allowed()):
                raise ValueError
            return value
        if isinstance(value, bool):
            raise ValueError
        if kind is float and isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            value = float(value)
        if kind is int and not isinstance(value, int):
            raise ValueError
        if kind is float and not isinstance(value, (int, float)):
            raise ValueError
        if kind is float:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError
        if self.choices is not None and value not in self.allowed():
            raise ValueError
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            raise ValueError
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            raise ValueError
        return value


def knob(default, kind: type, doc: str = "", **spec):
    """A config field: default, type and range or allowed values (see Spec), and what it means."""
    meta = {"spec": Spec(kind, **spec), "doc": doc}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def int_knob(default, doc: str = "", lo=None, **kw):
    return knob(default, int, doc, lo=lo, **kw)


def prob(default: float, doc: str = ""):
    return knob(default, float, doc, lo=0.0, hi=1.0)


_DEFERRED: ContextVar[bool] = ContextVar("registries_deferred", default=False)


@contextmanager
def registries_deferred():
    """Validate without the fields whose allowed values are a registry's names: a process that has not yet imported
    what registers them (a stage's early check, before torch) checks everything else; `run_stage` checks them."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def validate(obj) -> None:
    """Check (and coerce) every field of a config object by its Spec; raise ConfigError naming the field. Fields
    whose allowed values are a registry's names come last, so every other problem is found first."""
    specs = [(f, f.metadata.get("spec")) for f in fields(obj)]
    for f, spec in sorted(specs, key=lambda fs: fs[1] is not None and fs[1].lazy):
        if spec is None or (spec.lazy and _DEFERRED.get()):
            continue
        value = getattr(obj, f.name)
        try:
            good = spec.coerce(value)
        except (ValueError, TypeError):
            if spec.lazy and not spec.allowed():
                raise ConfigError(f"{type(obj).__name__}.{f.name}: no {spec.choices.kind} is registered in this "
                                  "process (the package that implements them is not imported)") from None
            allowed = spec.describe()
            if spec.choices and spec.kind is str and isinstance(value, str):
                raise ConfigError(f"{type(obj).__name__}.{f.name}: unknown value {value!r}; allowed: "
                                  f"{', '.join(map(str, spec.allowed()))}") from None
            raise ConfigError(f"{type(obj).__name__}.{f.name}: expected {allowed}, got {value!r}") from None
        if good is not value:
            object.__setattr__(obj, f.name, good)


class Section:
    """Base of every params section: validated on construction, plain dict out."""

    def __post_init__(self):
        validate(self)
        self.check()

    def check(self) -> None:
        """Checks that involve several fields (override)."""

    def to_dict(self) -> dict:
        return asdict(self)
