"""params.yaml: one typed, validated section per stage. A bad value fails with one line naming the field and
the allowed values, before any compute and before any output is written."""
from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path

import yaml

from agentrl.config import (UserError, AblateConfig, BaseConfig, ConfigError, FaultsConfig, ModelParams, PreflightConfig, ReportConfig,
                            RLConfig, RunConfig, SelectConfig, SFTConfig, TasksConfig, TestConfig, ThreadsConfig,
                            TrainConfig)

class ParamsError(UserError):
    """A params.yaml problem; str() is one line naming the field."""


def _rl_params(**kw) -> RLConfig:
    if "seed" in kw:
        raise ConfigError("RLConfig.seed: set run.seed instead (one seed for the whole pipeline)")
    return RLConfig(**kw)


SECTIONS = {
    "run": RunConfig, "tasks": TasksConfig, "model": ModelParams, "base": BaseConfig, "sft": SFTConfig,
    "rl": _rl_params, "preflight": PreflightConfig, "train": TrainConfig, "select": SelectConfig,
    "test": TestConfig, "ablate": AblateConfig, "faults": FaultsConfig, "threads": ThreadsConfig,
    "report": ReportConfig,
}
_FIELDS = {name: [f.name for f in fields(RLConfig if name == "rl" else cls) if not (name == "rl" and f.name == "seed")]
           for name, cls in SECTIONS.items()}
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _coerce_floats(cls, values: dict) -> dict:
    """YAML 1.1 reads `1e-3` as a string; accept it for float fields."""
    target = RLConfig if cls is _rl_params else cls
    types = {f.name: f.type for f in fields(target)}
    out = dict(values)
    for k, v in values.items():
        if types.get(k) in (float, "float") and isinstance(v, str) and _FLOAT_RE.match(v.strip()):
            out[k] = float(v)
            if not math.isfinite(out[k]):
                out[k] = v
    return out


def read_params_file(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"{path}: {unknown[0]}: unknown section; allowed: {', '.join(SECTIONS)}")
    return raw


def load_section(name: str, raw: dict, path: str = "params.yaml"):
    """Validate one section (missing keys take their defaults) -> its config object."""
    cls = SECTIONS[name]
    values = raw.get(name) or {}
    if not isinstance(values, dict):
        raise ParamsError(f"{path}: {name}: expected a mapping, got {values!r}")
    unknown = sorted(set(values) - set(_FIELDS[name]))
    if unknown:
        raise ParamsError(f"{path}: {name}.{unknown[0]}: unknown key; allowed: {', '.join(_FIELDS[name])}")
    try:
        return cls(**_coerce_floats(cls, values))
    except ConfigError as exc:
        msg = str(exc)
        field_name = msg.split(":", 1)[0].split(".", 1)[-1]
        raise ParamsError(f"{path}: {name}.{field_name}:{msg.split(':', 1)[1]}") from None


def load_params(sections: list[str], path: str | Path = "params.yaml") -> dict:
    """Validate the named sections of params.yaml (and the file's section names) -> {name: config}."""
    raw = read_params_file(path)
    return {name: load_section(name, raw, str(path)) for name in sections}
