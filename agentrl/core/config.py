"""Every knob of the pipeline, declared once.

One frozen dataclass per params.yaml section; every field is a `knob` (agentrl.core.knobs) that states its type, its
range or allowed values and what it means. `validate` checks every field by its declaration (numbers must be
finite; a YAML '1e-3' string is read as a float), so a section object that exists is valid. `load_params` reads
params.yaml, rejects unknown or missing sections and unknown keys, and builds the sections a stage asks for; every
problem is one line naming the field and what is allowed (ParamsError), before any compute and before any output
is written.

This module is the bottom layer: fixed enumerations (families, rewards, fault names, devices) are declared here as
tuples; the variants of the objective and the loop (loss modes, KL estimators, the research knobs' variants) are
registries (agentrl.core.variants) whose entries the modules implementing them register, so a knob's allowed values
are the names registered.
"""
from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import yaml

from agentrl.core import files, strict_yaml
from agentrl.core.knobs import ConfigError, Diverged, ParamsError, Section, Spec, UserError, knob, prob, validate  # noqa: F401
from agentrl.core.knobs import int_knob as _int
from agentrl.core.lab_config import DEVICES, LAB_CONFIGS, LabConfig, LabRun, lab_run  # noqa: F401 (the lab section)
from agentrl.core.numerics import NUMERICS_MODES
from agentrl.core.rl_config import REWARDS, SEED, SEED_MAX, RLConfig  # noqa: F401 (the rl section)

FAMILIES = ("minmax", "range", "init", "compare", "zero")
FAULT_NAMES = ("mask_shift", "stale_old_logp", "entropy_sign", "sign_flip", "accum_local", "sampler_temp",
               "ref_is_policy")
STARTS = ("base", "sft")   # starting policies an ablation arm may name
# the ablation's arms: name -> overrides of rl: ("rl.<key>": value) and the starting policy ("start")
ARMS = {"default": {}, "kl": {"rl.kl_coef": 0.05, "rl.kl_kind": "k3"}, "sft": {"start": "sft"},
        "public": {"rl.reward": "public"}}




# ---------------------------------------------------------------- the sections

@dataclass(frozen=True)
class RunConfig(Section):
    seed: int = _int(0, "every random stream derives from it (agentrl.core.seeding)", **SEED)
    threads: int = _int(2, "torch.set_num_threads at every entry point, before any tensor work", lo=1)
    numerics: str = knob("portable", str, "CPU kernels: portable (AVX2-level, the same bits on every x86-64 machine"
                         " with AVX2) or native (the CPU's best; bits tied to the machine class)",
                         choices=NUMERICS_MODES)


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
    emb_std: float = knob(1.0, float, "token-embedding init std (docs/deviations.md: held-out generalization)",
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
    """The chosen checkpoint is the best on validation; the stopping rules, fixed before the run, only report where
    they would have stopped and what that would have cost (agentrl.eval.stopping)."""
    n_boot: int = _int(10000, lo=100)
    alpha: float = knob(0.05, float, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    stop_patience: int = _int(0, "rule (a): stop after this many checkpoints in a row that do not beat the previous "
                              "checkpoint's interval (0: off)", lo=0)
    stop_zero_adv: float = prob(0.75, "rule (b): the zero-advantage share it watches ...")
    stop_zero_adv_steps: int = _int(0, "... stop once zero_adv_frac stayed above it for this many steps (0: off)",
                                    lo=0)


@dataclass(frozen=True)
class TestConfig(Section):
    episodes_per_task: int = _int(32, lo=1)
    ks: list = knob([1, 2, 4, 8], list, item=int, lo=1, nonempty=True)
    n_boot: int = _int(10000, lo=100)
    alpha: float = knob(0.05, float, lo=0.0, hi=1.0, lo_open=True, hi_open=True)

    def check(self):
        if max(self.ks) > self.episodes_per_task:
            raise ConfigError(f"TestConfig.ks: k={max(self.ks)} exceeds episodes_per_task={self.episodes_per_task}")


ARM_NAME = re.compile(r"[A-Za-z0-9_]+")   # used with fullmatch: `$` would let a final newline through


def arm_overrides(arm: str, spec: dict) -> tuple[dict, str]:
    """An arm's (rl overrides, starting policy), every key and value checked: "rl.<key>" is any rl key with a value
    it allows, "start" is one of STARTS. Raises ConfigError naming the arm and the field."""
    where = f"AblateConfig.arms: {arm}"
    if not isinstance(arm, str) or not ARM_NAME.fullmatch(arm):
        raise ConfigError(f"AblateConfig.arms: {arm!r}: an arm name is letters, digits and _ (it names DVC stages)")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping of overrides like {{rl.lr: 0.0001}}, got {spec!r}")
    rl, start = {}, "base"
    for key, value in spec.items():
        if key == "start":
            if value not in STARTS:
                raise ConfigError(f"{where}: start: unknown value {value!r}; allowed: {', '.join(STARTS)}")
            start = value
        elif isinstance(key, str) and key.startswith("rl.") and key[3:] in section_keys("rl"):
            rl[key[3:]] = value
        else:
            raise ConfigError(f"{where}: {key}: unknown key; allowed: start, rl.<key> with <key> one of "
                              f"{', '.join(section_keys('rl'))}")
    try:
        RLConfig(**rl)
    except ConfigError as exc:
        field_, rest = str(exc).split(":", 1)
        raise ConfigError(f"{where}: rl.{field_.split('.', 1)[-1]}:{rest}") from None
    return rl, start


@dataclass(frozen=True)
class AblateConfig(Section):
    arms: dict = knob(ARMS, dict, "arm -> overrides: {rl.<key>: value, start: base|sft}; add one with dvc exp run "
                      "-S '+ablate.arms.<name>={rl.<key>: value}'", nonempty=True)
    seeds: list = knob([0, 1, 2], list, item=int, **SEED, nonempty=True, unique=True)
    steps: int = _int(30, lo=1)
    eval_per_task: int = _int(16, "on all 10 held-out tasks", lo=1)
    n_boot: int = _int(10000, lo=100)
    alpha: float = knob(0.05, float, lo=0.0, hi=1.0, lo_open=True, hi_open=True)

    def check(self):
        for arm, spec in self.arms.items():
            arm_overrides(arm, spec)


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
                       **SEED, unique=True)


@dataclass(frozen=True)
class ThreadsConfig(Section):
    steps: int = _int(30, "the first steps of the main run ...", lo=1)
    compare_threads: int = _int(1, "... re-run at this thread count", lo=1)
    eval_per_task: int = _int(16, "held-out episodes per task for both runs", lo=1)


@dataclass(frozen=True)
class BehaviourConfig(Section):
    episodes_per_task: int = _int(32, "episodes per held-out task for 'what the agent learned'", lo=1)
    transcripts_per_family: int = _int(1, lo=0)


@dataclass(frozen=True)
class HumanEvalConfig(Section):
    """Repair tasks built from HumanEval's functions (agentrl.env.humaneval; docs/humaneval.md): which asserts are
    public, which problems are used, and how problems are split."""
    public: int = _int(2, "the first asserts of a problem's check shown by the test tool; the rest are hidden",
                       lo=1, hi=8)
    min_hidden: int = _int(2, "a problem needs at least this many hidden asserts", lo=1, hi=64)
    max_source_tokens: int = _int(160, "longest source a task may show (code tokens, as the read tool shows it)",
                                  lo=16, hi=2048)
    fractions: list = knob([0.4, 0.2, 0.4], list, "shares of problems in train, validation and test (problems "
                           "ranked by sha256 of their id: a problem's mutants are in one split)", item=float,
                           nonempty=True)

    def check(self):
        if len(self.fractions) != 3 or any(f <= 0 for f in self.fractions) or abs(sum(self.fractions) - 1) > 1e-9:
            raise ConfigError(f"HumanEvalConfig.fractions: expected three positive shares summing to 1 (train, "
                              f"validation, test), got {self.fractions!r}")


PRETRAINED = ("smollm2-135m-instruct",)   # pinned pretrained weights (agentrl.backends.pretrained.PINNED)


@dataclass(frozen=True)
class PretrainedConfig(Section):
    """Pinned pretrained weights (docs/labs.md): `make install` fetches them hash-checked; stage pretrained converts
    each listed model once into data/models/<name>/ (outside the default pipeline: models is empty by default)."""
    models: list = knob([], list, "the pinned models stage pretrained converts (empty: not in the default pipeline)",
                        item=str, choices=PRETRAINED, unique=True)


SECTIONS = {
    "run": RunConfig, "tasks": TasksConfig, "model": ModelParams, "base": BaseConfig, "sft": SFTConfig,
    "rl": RLConfig, "preflight": PreflightConfig, "train": TrainConfig, "select": SelectConfig, "test": TestConfig,
    "ablate": AblateConfig, "faults": FaultsConfig, "length": LengthConfig, "threads": ThreadsConfig,
    "behaviour": BehaviourConfig, "lab": LabConfig, "pretrained": PretrainedConfig, "humaneval": HumanEvalConfig,
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

MAX_PARAMS_BYTES = 1 << 20   # params.yaml is ~10 KB; a 50 MB file cost 92 s of CPU to parse


def read_params_file(path: str | Path = "params.yaml") -> dict:
    """The parsed params file, every byte read inside these checks: a regular file of at most MAX_PARAMS_BYTES,
    UTF-8, valid YAML within strict_yaml's bounds (depth, integer digits, aliases), a mapping of known sections.
    Each problem is one ParamsError line naming the file and where."""
    path = Path(path)
    try:
        data = files.read_bytes(path, MAX_PARAMS_BYTES, "the params file")
        text = files.decode_utf8(data, str(path))
    except FileNotFoundError:
        raise ParamsError(f"{path}: file not found") from None
    except files.InputFileError as exc:
        raise ParamsError(str(exc)) from None
    except OSError as exc:
        raise ParamsError(f"{path}: unreadable ({exc.strerror or type(exc).__name__})") from None
    try:
        raw = strict_yaml.load(text) or {}
    except strict_yaml.DuplicateKeyError as exc:
        raise ParamsError(f"{path}: {exc}; keep one") from None
    except strict_yaml.LimitError as exc:
        raise ParamsError(f"{path}: too large a document: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ParamsError(f"{path}: not valid YAML ({where}{getattr(exc, 'problem', None) or type(exc).__name__})") \
            from None
    except (ValueError, RecursionError) as exc:   # a scalar Python cannot convert; the bounds should stop both
        raise ParamsError(f"{path}: not valid YAML ({type(exc).__name__}: {str(exc)[:120]})") from None
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
