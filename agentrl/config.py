"""Every knob of the pipeline, declared once.

One frozen dataclass per params.yaml section; every field is a `knob` that states its type, its range or allowed
values and what it means. `validate` checks every field by its declaration (numbers must be finite; a YAML
'1e-3' string is read as a float), so a section object that exists is valid. `load_params` reads params.yaml,
rejects unknown or missing sections and unknown keys, and builds the sections a stage asks for; every problem is
one line naming the field and what is allowed (ParamsError), before any compute and before any output is written.

This module is the bottom layer: the allowed values of enumerated knobs (families, loss modes, KL estimators,
rewards, fault names) are declared here and the registries that implement them are checked against these
tuples by tests.
"""
from __future__ import annotations

import math
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import yaml

FAMILIES = ("minmax", "range", "init", "compare", "zero")
LOSS_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3")
REWARDS = ("hidden", "public")
KEEP_MODES = ("all", "informative")
FAULT_NAMES = ("mask_shift", "stale_old_logp", "entropy_sign", "sign_flip", "accum_local", "sampler_temp",
               "ref_is_policy")
ARMS = ("default", "kl", "sft", "public")


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
    kind: type                      # int, float, bool, str or list
    lo: float | None = None         # bounds (numbers; for lists: of each item)
    hi: float | None = None
    lo_open: bool = False           # lo < v instead of lo <= v
    hi_open: bool = False
    choices: tuple | None = None    # allowed values (str fields; for lists: of each item)
    item: type | None = None        # item type of a list
    nonempty: bool = False          # lists: at least one item
    unique: bool = False            # lists: no repeats

    def describe(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.kind is list:
            what = self._scalar(self.item)
            text = f"a {'non-empty ' if self.nonempty else ''}list of {'distinct ' if self.unique else ''}" + \
                   (f"values from {', '.join(map(str, self.choices))}" if self.choices else what.replace("a ", "", 1)
                    .replace("an ", "", 1) + "s")
            return text
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        return self._scalar(self.kind)

    def _scalar(self, kind) -> str:
        base = "an integer" if kind is int else "a finite number" if kind is float else "a string"
        bounds = []
        if self.lo is not None:
            bounds.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            bounds.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
        if len(bounds) == 2 and self.lo is not None and self.hi is not None:
            lb, rb = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"{base} in {lb}{self.lo:g}, {self.hi:g}{rb}"
        return base + (" " + " and ".join(bounds) if bounds else "")

    def coerce(self, value):
        """The value as the declared type, or raise ValueError (the caller names the field)."""
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
            if not isinstance(value, str) or (self.choices and value not in self.choices):
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
        if self.choices and value not in self.choices:
            raise ValueError
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            raise ValueError
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            raise ValueError
        return value


def knob(default, kind: type, doc: str = "", **spec):
    """A config field: default, type and range or allowed values (see Spec), and what it means."""
    meta = {"spec": Spec(kind, **spec), "doc": doc}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def prob(default: float, doc: str = ""):
    return knob(default, float, doc, lo=0.0, hi=1.0)


def validate(obj) -> None:
    """Check (and coerce) every field of a config object by its Spec; raise ConfigError naming the field."""
    for f in fields(obj):
        spec = f.metadata.get("spec")
        if spec is None:
            continue
        value = getattr(obj, f.name)
        try:
            good = spec.coerce(value)
        except (ValueError, TypeError):
            allowed = spec.describe()
            if spec.choices and spec.kind is str and isinstance(value, str):
                raise ConfigError(f"{type(obj).__name__}.{f.name}: unknown value {value!r}; allowed: "
                                  f"{', '.join(map(str, spec.choices))}") from None
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


def _int(default, doc="", lo=None, **kw):
    return knob(default, int, doc, lo=lo, **kw)


# ---------------------------------------------------------------- the sections

@dataclass(frozen=True)
class RunConfig(Section):
    seed: int = _int(0, "every random stream derives from it (agentrl.seeding)", lo=0)
    threads: int = _int(2, "torch.set_num_threads at every entry point, before any tensor work", lo=1)


@dataclass(frozen=True)
class TasksConfig(Section):
    families: list = knob(list(FAMILIES), list, "bug families in the catalogue", item=str, choices=FAMILIES,
                          nonempty=True, unique=True)


@dataclass(frozen=True)
class ModelParams(Section):
    d_model: int = _int(64, lo=1)
    n_layer: int = _int(3, lo=1)
    n_head: int = _int(4, lo=1)
    d_ff: int = _int(256, lo=1)
    max_len: int = _int(1024, lo=64)
    tie_embeddings: bool = knob(True, bool)
    emb_std: float = knob(1.0, float, "token-embedding init std (docs/design.md: held-out generalization)",
                          lo=0.0, lo_open=True)

    def check(self):
        if self.d_model % self.n_head:
            raise ConfigError(f"ModelParams.n_head: must divide d_model={self.d_model}, got {self.n_head}")


@dataclass(frozen=True)
class BaseConfig(Section):
    """The scripted mixture the RL base is cloned from, and the cloning run."""
    p_read: float = prob(0.25, "first call reads the source")
    p_right_after_read: float = prob(0.3, "after reading, apply the keyword rule's op; otherwise guess")
    p_hardcode: float = prob(0.14, "a guess is hardcode_tests with this probability, else a uniform repair op")
    p_test: float = prob(0.3, "run the tests after the edit")
    p_give_up: float = prob(0.3, "at the edit decision, submit the unedited source instead")
    p_persist: float = prob(0.0, "after a test showed a failure, keep trying (read/test/another edit) per turn")
    p_malformed: float = prob(0.03, "any call is replaced by a malformed one")
    cover_read: float = prob(0.6, "demonstrations open with a read this often (targets keep p_read)")
    p_rename_operands: float = prob(0.75, "demonstrations show operands under filler names this often")
    choice_weight: float = knob(8.0, float, "loss weight of choice points (targets that are not one-hot)", lo=1.0)
    teach_steps: int = _int(150, "first clone a mixture that always applies the keyword op after a read", lo=0)
    demos_per_task: int = _int(100, lo=1)
    steps: int = _int(300, lo=1)
    batch_size: int = _int(64, lo=1)
    lr: float = knob(3e-3, float, lo=0.0, lo_open=True)


@dataclass(frozen=True)
class SFTConfig(Section):
    steps: int = _int(10, "the cold start: steps on one oracle demonstration per train task", lo=1)
    lr: float = knob(1e-4, float, lo=0.0, lo_open=True)
    describe_per_task: int = _int(16, "episodes per train task for describe() (pass@8 needs 8)", lo=8)


@dataclass(frozen=True)
class RLConfig(Section):
    """GRPO (agentrl.rl.trainer); the seed is run.seed."""
    group_size: int = _int(8, "episodes per task (the GRPO group; two or more to compare)", lo=2)
    tasks_per_step: int = _int(8, "groups per step: 64 episodes", lo=1)
    lr: float = knob(3e-4, float, "Adam; 1e-3 takes ~10x larger steps on this parametrization (docs/design.md)",
                     lo=0.0, lo_open=True)
    epochs: int = _int(1, "passes over the batch per step", lo=1)
    minibatches: int = _int(2, "optimizer steps per epoch", lo=1)
    microbatches: int = _int(1, "gradient accumulation inside a minibatch (token-weighted, exact)", lo=1)
    clip_eps: float = knob(0.2, float, lo=0.0, lo_open=True)
    max_grad_norm: float = knob(1.0, float, lo=0.0, lo_open=True)
    temperature: float = knob(1.0, float, "sampling temperature", lo=0.0, lo_open=True)
    kl_coef: float = knob(0.0, float, "KL to the frozen starting policy (0 = no reference)", lo=0.0)
    kl_kind: str = knob("k3", str, choices=KL_KINDS)
    entropy_coef: float = knob(0.0, float)
    loss_mode: str = knob("token_mean", str, choices=LOSS_MODES)
    loss_norm_len: int = _int(1024, "seq_mean_token_sum_norm divides the summed loss by rows x this constant (verl's "
                              "loss_scale_factor), not by the padded width; default: the longest row the model "
                              "takes (model.max_len)", lo=1)
    adv_std_scale: bool = knob(False, bool, "GRPO std scaling of group advantages (off: Dr. GRPO)")
    keep: str = knob("all", str, "train on all groups, or only 'informative' ones", choices=KEEP_MODES)
    max_turns: int = _int(6, lo=1)
    max_call_tokens: int = _int(5, "a call without </call> is cut off after this many tokens", lo=3)
    reward: str = knob("hidden", str, "hidden tests; 'public' is the reward-hacking control", choices=REWARDS)
    rename: bool = knob(True, bool, "randomize function names per episode")
    seed: int = _int(0, "run.seed (not an rl key)", lo=0)

    def check(self):
        if self.group_size * self.tasks_per_step < self.minibatches:
            raise ConfigError(f"RLConfig.minibatches: {self.minibatches} exceeds the batch "
                              f"({self.group_size * self.tasks_per_step} episodes)")


@dataclass(frozen=True)
class PreflightConfig(Section):
    kl_coef: float = knob(0.1, float, "so invariant 9 (KL to reference > 0) has teeth", lo=0.0, lo_open=True)
    bugs: list = knob(list(FAULT_NAMES), list, "injected faults of the fault matrix", item=str,
                      choices=FAULT_NAMES, unique=True)


@dataclass(frozen=True)
class TrainConfig(Section):
    steps: int = _int(60, lo=1)
    checkpoint_every: int = _int(10, lo=1)
    eval_per_task: int = _int(16, "validation episodes per task at each checkpoint", lo=1)


@dataclass(frozen=True)
class SelectConfig(Section):
    n_boot: int = _int(10000, lo=100)
    alpha: float = knob(0.05, float, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class TestConfig(Section):
    episodes_per_task: int = _int(32, lo=1)
    ks: list = knob([1, 2, 4, 8], list, item=int, lo=1, nonempty=True)
    n_boot: int = _int(10000, lo=100)
    alpha: float = knob(0.05, float, lo=0.0, hi=1.0, lo_open=True, hi_open=True)

    def check(self):
        if max(self.ks) > self.episodes_per_task:
            raise ConfigError(f"TestConfig.ks: k={max(self.ks)} exceeds episodes_per_task={self.episodes_per_task}")


@dataclass(frozen=True)
class AblateConfig(Section):
    arms: list = knob(list(ARMS), list, item=str, choices=ARMS, nonempty=True, unique=True)
    seeds: list = knob([0, 1, 2], list, item=int, lo=0, nonempty=True, unique=True)
    steps: int = _int(30, lo=1)
    eval_per_task: int = _int(16, "on all 10 held-out tasks", lo=1)
    kl_coef: float = knob(0.05, float, "the 'kl' arm", lo=0.0, lo_open=True)
    kl_kind: str = knob("k3", str, choices=KL_KINDS)
    n_boot: int = _int(10000, lo=100)
    alpha: float = knob(0.05, float, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class FaultsConfig(Section):
    steps: int = _int(24, "most catalogue runs", lo=1)
    short_steps: int = _int(8, "sign_flip and lr 1e-2", lo=1)
    eval_every: int = _int(8, "held-out evaluation every this many steps", lo=1)
    eval_per_task: int = _int(8, lo=1)
    high_lr: float = knob(1e-2, float, lo=0.0, lo_open=True)
    kl_coef: float = knob(0.1, float, "the KL run and its ref_is_policy twin", lo=0.0, lo_open=True)


# the mixture knobs of the length pair's start: LengthConfig.p_<k> replaces BaseConfig.p_<k>
LENGTH_START_KNOBS = ("read", "test", "give_up", "hardcode", "persist")


@dataclass(frozen=True)
class LengthConfig(Section):
    """The length-bias pair (docs/length_bias.md): its start, its runs, and the seeds of the robustness study."""
    p_read: float = prob(1.0, "the start reads, ...")
    p_test: float = prob(1.0, "... tests every repair, ...")
    p_give_up: float = prob(0.0, "... never gives up ...")
    p_hardcode: float = prob(0.0, "... or hardcodes, ...")
    p_persist: float = prob(0.8, "... and after a failed test keeps calling tools with this probability per turn")
    steps: int = _int(16, lo=1)
    turns: int = _int(12, "max_turns of both runs", lo=1)
    kl_coef: float = knob(0.05, float, "both runs: KL to their start (rl.kl_kind)", lo=0.0)
    tasks_per_step: int = _int(8, "both runs (as rl.tasks_per_step)", lo=1)
    seeds: list = knob([], list, "the length_pair study's seeds (empty: not in the default pipeline)", item=int,
                       lo=0, unique=True)


@dataclass(frozen=True)
class ThreadsConfig(Section):
    steps: int = _int(30, "the first steps of the main run ...", lo=1)
    compare_threads: int = _int(1, "... re-run at this thread count", lo=1)
    eval_per_task: int = _int(16, "held-out episodes per task for both runs", lo=1)


@dataclass(frozen=True)
class BehaviourConfig(Section):
    episodes_per_task: int = _int(32, "episodes per held-out task for 'what the agent learned'", lo=1)
    transcripts_per_family: int = _int(1, lo=0)


SECTIONS = {
    "run": RunConfig, "tasks": TasksConfig, "model": ModelParams, "base": BaseConfig, "sft": SFTConfig,
    "rl": RLConfig, "preflight": PreflightConfig, "train": TrainConfig, "select": SelectConfig, "test": TestConfig,
    "ablate": AblateConfig, "faults": FaultsConfig, "length": LengthConfig, "threads": ThreadsConfig,
    "behaviour": BehaviourConfig,
}


def section_values(name: str, obj) -> dict:
    """The values a stage read from one params section (rl.seed is run.seed, not an rl key)."""
    values = obj.to_dict()
    if name == "rl":
        values.pop("seed", None)
    return values


def section_keys(name: str) -> list[str]:
    """The keys a params.yaml section may hold (rl.seed is run.seed, not an rl key)."""
    return [f.name for f in fields(SECTIONS[name]) if not (name == "rl" and f.name == "seed")]


def defaults(name: str) -> dict:
    """The library default of every key of a section."""
    out = {}
    for f in fields(SECTIONS[name]):
        if f.name in section_keys(name):
            out[f.name] = f.default_factory() if f.default is MISSING else f.default
    return out


# ---------------------------------------------------------------- params.yaml

def read_params_file(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ParamsError(f"{path}: not valid YAML ({first})") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections")
    unknown = sorted(set(raw) - set(SECTIONS), key=str)
    if unknown:
        raise ParamsError(f"{path}: {unknown[0]}: unknown section; allowed: {', '.join(SECTIONS)}")
    return raw


def load_section(name: str, raw: dict, path: str = "params.yaml", seed: int | None = None):
    """Validate one section of a parsed params file -> its config object. A missing section is an error;
    keys missing from a present section take their declared defaults."""
    if name not in raw:
        raise ParamsError(f"{path}: {name}: missing section; every stage's sections must be present "
                          f"(keys: {', '.join(section_keys(name))})")
    values = raw.get(name) or {}
    if not isinstance(values, dict):
        raise ParamsError(f"{path}: {name}: expected a mapping, got {values!r}")
    allowed = section_keys(name)
    unknown = sorted((k for k in values if k not in allowed), key=str)
    if unknown:
        hint = "; set run.seed instead (one seed for the whole pipeline)" if name == "rl" and "seed" in unknown \
            else f"; allowed: {', '.join(allowed)}"
        raise ParamsError(f"{path}: {name}.{unknown[0]}: unknown key{hint}")
    if name == "rl" and seed is not None:
        values = {**values, "seed": seed}
    try:
        return SECTIONS[name](**values)
    except ConfigError as exc:
        cls, rest = str(exc).split(":", 1)
        raise ParamsError(f"{path}: {name}.{cls.split('.', 1)[-1]}:{rest}") from None


def load_params(sections: list[str], path: str | Path = "params.yaml") -> dict:
    """The named sections of params.yaml, validated -> {name: config}. The rl section takes run.seed."""
    raw = read_params_file(path)
    seed = load_section("run", raw, str(path)).seed if "rl" in sections else None
    return {name: load_section(name, raw, str(path), seed) for name in sections}


def validate_all(path: str | Path = "params.yaml") -> dict:
    """Every section of params.yaml, validated (the whole pipeline's params, before any stage runs)."""
    return load_params(list(SECTIONS), path)
