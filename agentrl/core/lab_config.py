"""The lab section of params.yaml (docs/labs.md): the real-model labs, each an entry of `lab.configs` validated as
a `LabRun`, outside the default pipeline unless `lab.runs` names it.

An entry names what it changes: `base: <another entry>` takes that entry's keys (its own base first), then the
entry's own keys replace them, `rl` key by key. A seed is not a config: a lab runs at the seeds `lab.seeds` lists
(DVC's matrix) or `--seed` names, and `resolve` refuses a `seed` key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from agentrl.core.knobs import ConfigError, Section, knob
from agentrl.core.knobs import int_knob as _int
from agentrl.core.numerics import NUMERICS_MODES
from agentrl.core.rl_config import SEED, RLConfig

DEVICES = ("cpu", "cuda")
DTYPES = ("fp32", "bf16")
PREFIX_KV = ("repeat", "once")   # the sampler's shared prompt prefix (agentrl.backends.hf_sampler)
DEMOS = ("expert", "format")
TASK_SOURCES = ("authored", "humaneval")   # agentrl.env.tasks.TASK_SOURCES (tests keep them equal)
EVAL_SPLITS = ("heldout", "validation", "test")
# agentrl.labs.baselines.ARMS (tests keep them equal)
BASELINE_ARMS = ("more_cloning", "more_cloning_tokens", "rejection_sampling", "rejection_sampling_grpo_lr")
LAB_NAME = re.compile(r"[A-Za-z0-9_]+")
# rl keys a lab sets through its own fields (lr, tasks_per_step, episodes_per_task, ...), not through `rl`
LAB_OWNED_RL_KEYS = ("group_size", "tasks_per_step", "lr", "microbatches", "max_call_tokens", "max_turns", "seed")


@dataclass(frozen=True)
class LabRun(Section):
    """One real-model lab (docs/labs.md), an entry of lab.configs: its environment, model, cold start and GRPO."""
    environment: str = knob("gym", str, "a registered environment (agentrl.env.registry): gym or coding")
    model: str | None = knob(None, str, "a Hugging Face model directory (Qwen3 or Llama: config.json, weights, "
                             "tokenizer files); null: a small random-init Qwen3 written here with save_pretrained",
                             nullable=True)
    hidden: int = _int(64, "the small Qwen3's hidden size (when model is null)", lo=8, hi=4096)
    layers: int = _int(2, "the small Qwen3's decoder layers (when model is null)", lo=1, hi=64)
    demos_per_task: int = _int(2, "cold start: scripted-expert conversations per training task", lo=0, hi=1000)
    demos: str = knob("expert", str, "cold start demonstrations: expert (read, the keyword rule's op, test, submit) "
                      "or format (the same calls with the op drawn uniformly from the repair ops: the format "
                      "taught, the decision left to GRPO)", choices=DEMOS)
    clone_steps: int = _int(200, "cold start: behaviour-cloning Adam steps (0: none)", lo=0, hi=100_000)
    clone_lr: float = knob(3e-3, float, "cold start: Adam learning rate", lo=0.0, lo_open=True)
    clone_batch: int = _int(8, "cold start: conversations per cloning step", lo=1, hi=4096)
    steps: int = _int(25, "GRPO steps", lo=1, hi=100_000)
    tasks_per_step: int = _int(4, "GRPO: tasks per step", lo=1, hi=1024)
    episodes_per_task: int = _int(8, "GRPO: episodes per task (the group)", lo=2, hi=1024)
    lr: float = knob(4e-4, float, "GRPO: Adam learning rate", lo=0.0, lo_open=True)
    microbatches: int = _int(1, "GRPO: gradient accumulation inside a minibatch", lo=1, hi=1024)
    new_tokens: int = _int(24, "new tokens per turn: a turn without its end-of-turn token is cut off after this many",
                           lo=3, hi=4096)
    max_turns: int = _int(6, "turns per episode", lo=1, hi=64)
    eval_per_task: int = _int(8, "held-out episodes per task at each evaluation", lo=1, hi=4096)
    numerics: str | None = knob(None, str, "CPU numerics of this lab (portable or native); null: run.numerics. A "
                                "pretrained model's GEMMs run several times faster native", choices=NUMERICS_MODES,
                                nullable=True)
    probe_group: int = _int(4, "episodes per group of the preflight's two groups (its float64 references hold "
                            "[policy tokens, vocabulary] log-softmaxes)", lo=2, hi=64)
    dtype: str = knob("fp32", str, "fp32, or bf16 mixed precision (fp32 master weights and Adam; sampler and trainer "
                      "compute in bf16): a CPU needs amx_bf16 or avx512_bf16 and numerics: native, else it is refused",
                      choices=DTYPES)
    prefix_kv: str = knob("repeat", str, "the sampler's shared prompt prefix: its keys and values copied into every "
                          "row (repeat, the committed seeds' order) or kept once for all rows (once: the same "
                          "function in another floating-point order, x1.28 faster on an evaluation of 40 rows; "
                          "docs/performance.md)", choices=PREFIX_KV)
    tasks: str = knob("authored", str, "where the training tasks come from: authored (the catalogue's 20) or "
                      "humaneval (the train split stage humaneval built; docs/humaneval.md)", choices=TASK_SOURCES)
    eval_tasks: str = knob("authored", str, "where the held-out tasks come from: authored or humaneval",
                           choices=TASK_SOURCES)
    eval_split: str = knob("heldout", str, "which of eval_tasks' splits is held out: heldout (validation and test), "
                           "validation (for choosing a recipe) or test (never looked at while one is chosen)",
                           choices=EVAL_SPLITS)
    rl: dict = knob({}, dict, "overrides of the pipeline's rl: keys for this lab's GRPO (keep, temperature, "
                    "clip_eps_high, kl_coef, lr_warmup, ...), validated as rl: is; the lab's own fields set lr, "
                    "tasks_per_step, episodes_per_task, microbatches, new_tokens and max_turns")
    max_kl: float | None = knob(None, float, "a bound on each GRPO update: a minibatch whose approximate KL to the "
                                "sampling policy exceeds it is not stepped and the update ends (null: no bound; "
                                "the KL is reported either way)", lo=0.0, lo_open=True, nullable=True)
    signal_tasks: int = _int(8, "after the cold start, the signal check samples this many training tasks x "
                             "episodes_per_task (groups of the lab's size); 0: no check", lo=0, hi=1024)
    min_signal: float = knob(0.25, float, "the signal check's gate: the share of its groups whose rewards disagree "
                             "must reach this, else the lab stops before GRPO (0: report only)", lo=0.0, hi=1.0)
    temperatures: list = knob([], list, "after GRPO, the cold start and GRPO's checkpoint evaluated on the held-out "
                              "tasks at each of these sampling temperatures (0 < T <= 2; T = 1 is the report's own "
                              "evaluations), GRPO's gain over the cold start at its best one reported "
                              "(agentrl.labs.temperatures); empty: none")
    baselines: list = knob([], list, "after GRPO, compute-matched baselines from the same cold start, each "
                           "paired with GRPO in the report (agentrl.labs.baselines): " + ", ".join(BASELINE_ARMS)
                           + "; empty: none")

    def check(self):
        rl_overrides(self.rl)
        for t in self.temperatures:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 2:
                raise ConfigError(f"LabRun.temperatures: {t!r} is not a sampling temperature; allowed: numbers in "
                                  "(0, 2]")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise ConfigError(f"LabRun.temperatures: {self.temperatures} repeats a temperature; allowed: each once")
        for arm in self.baselines:
            if arm not in BASELINE_ARMS:
                raise ConfigError(f"LabRun.baselines: unknown value {arm!r}; allowed: {', '.join(BASELINE_ARMS)}")
        if len(set(self.baselines)) != len(self.baselines):
            raise ConfigError(f"LabRun.baselines: {self.baselines} repeats an arm; allowed: each once")
        if self.dtype == "bf16" and self.numerics == "portable":
            raise ConfigError("LabRun.dtype: bf16 needs numerics: native (portable numerics cap oneDNN at AVX2, "
                              "where bf16 products are emulated, slower than fp32); allowed with portable: fp32")
        if self.demos_per_task == 0 and self.clone_steps > 0:
            raise ConfigError("LabRun.clone_steps: a cold start needs demonstrations (demos_per_task > 0); set "
                              "clone_steps: 0 for none")
        if self.model is None:
            need, have = small_model_training_bytes(self.hidden, self.layers), memory_bytes()
            if have and need > 0.8 * have:
                raise ConfigError(f"LabRun.hidden: a random-init Qwen3 of hidden {self.hidden} and {self.layers} "
                                  f"layers needs about {need / 2**30:.1f} GiB for its weights, gradients and Adam's "
                                  f"state; this machine has {have / 2**30:.1f} GiB")


def rl_overrides(spec) -> dict:
    """A lab's `rl` overrides, every key and value checked as rl: is (ConfigError naming LabRun.rl.<key>)."""
    if not isinstance(spec, dict):
        raise ConfigError(f"LabRun.rl: expected a mapping of rl keys, got {spec!r}")
    allowed = [f.name for f in fields(RLConfig) if f.name not in LAB_OWNED_RL_KEYS]
    for key in spec:
        if key in LAB_OWNED_RL_KEYS:
            raise ConfigError(f"LabRun.rl.{key}: set by the lab's own fields (lr, tasks_per_step, episodes_per_task, "
                              "microbatches, new_tokens, max_turns), not through rl")
        if key not in allowed:
            raise ConfigError(f"LabRun.rl.{key}: unknown key; allowed: {', '.join(allowed)}")
    try:
        replace(RLConfig(), **spec)
    except ConfigError as exc:
        raise ConfigError(f"LabRun.rl.{str(exc).split(':', 1)[0].split('.', 1)[-1]}:{str(exc).split(':', 1)[1]}") \
            from None
    return dict(spec)


QWEN3_VOCAB = 151_936   # the pinned Qwen3 tokenizer's vocabulary, which the small random-init Qwen3 uses


def small_model_training_bytes(hidden: int, layers: int) -> int:
    """Weights, gradients and Adam's two moments (4 x 4 bytes a parameter) of the small random-init Qwen3
    (agentrl.backends.hf.small_config: tied embeddings, 4 heads of 16, 2 key-value heads, an MLP of 192)."""
    per_layer = hidden * 64 + 2 * hidden * 32 + 64 * hidden + 3 * hidden * 192 + 2 * hidden
    return 16 * (QWEN3_VOCAB * hidden + layers * per_layer + hidden)


def memory_bytes() -> int | None:
    """This machine's memory (MemTotal of /proc/meminfo), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# the labs a params.yaml without lab.configs has: the small random-init Qwen3 on the gym's tools (menu) and on the
# generic coding tools (tools)
LAB_CONFIGS = {
    "menu": {},
    "tools": {"environment": "coding", "new_tokens": 72, "clone_steps": 150, "steps": 8, "episodes_per_task": 4,
              "probe_group": 2},
}
BASE = "base"   # the key of an entry that names the entry it derives from
RUN_KEYS = tuple(f.name for f in fields(LabRun))


def _entry(configs: dict, name: str, where: str) -> dict:
    """One entry of lab.configs, its name and its own keys checked (not its values: LabRun does that)."""
    if not isinstance(name, str) or not LAB_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r}: a lab name is letters, digits and _ (it names a DVC stage)")
    spec = configs[name]
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}.{name}: expected a mapping of LabRun keys, got {spec!r}")
    return spec


def _own_keys(spec: dict, where: str) -> None:
    """An entry's keys: LabRun's, and `base`; a seed is refused with where seeds go."""
    for key in sorted(spec, key=str):
        if key == "seed":
            raise ConfigError(f"{where}.seed: a seed is not part of a lab's config; run it with --seed N "
                              "(python -m stages.lab) or list it in lab.seeds (the stage's matrix)")
        if key != BASE and key not in RUN_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key; allowed: {BASE}, {', '.join(RUN_KEYS)}")
    _base_is_a_name(spec, where)


def _base_is_a_name(spec: dict, where: str) -> None:
    if BASE in spec and not isinstance(spec[BASE], str):
        raise ConfigError(f"{where}.{BASE}: expected the name of another entry of lab.configs, got {spec[BASE]!r}")


def merge(base: dict, own: dict) -> dict:
    """An entry's keys over its base's (resolved) keys: each key replaces the base's, `rl` key by key."""
    out = {**base}
    for key, value in own.items():
        if key == BASE:
            continue
        if key == "rl" and isinstance(value, dict) and isinstance(base.get("rl"), dict):
            out["rl"] = {**base["rl"], **value}
        else:
            out[key] = value
    return out


def resolve(configs: dict, name: str, where: str = "LabConfig.configs", strict: bool = True) -> dict:
    """The keys lab.configs.<name> runs with: its base chain merged (the entry last), `base` gone. A missing or
    circular base, an unknown key or a `seed` is a ConfigError naming the entry and the field (not strict: keys are
    taken as they are, for comparing a record's values with the file's)."""
    chain: list[str] = []
    current = name
    while True:
        if current in chain:
            raise ConfigError(f"{where}.{chain[-1]}.{BASE}: {current} is circular "
                              f"({' -> '.join([*chain, current])})")
        spec = _entry(configs, current, where)
        if strict:
            _own_keys(spec, f"{where}.{current}")
        _base_is_a_name(spec, f"{where}.{current}")
        chain.append(current)
        if BASE not in spec:
            break
        if spec[BASE] not in configs:
            raise ConfigError(f"{where}.{current}.{BASE}: unknown value {spec[BASE]!r}; allowed: "
                              f"{', '.join(k for k in configs if k != current)}")
        current = spec[BASE]
    out: dict = {}
    for entry in reversed(chain):
        out = merge(out, configs[entry])
    return out


def resolve_spec(spec, configs: dict, where: str, strict: bool = True) -> dict:
    """A config outside lab.configs (a recipe's config file): its own keys over its base in lab.configs, if any."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping of LabRun keys, got {spec!r}")
    if strict:
        _own_keys(spec, where)
    _base_is_a_name(spec, where)
    if BASE not in spec:
        return merge({}, spec)
    if spec[BASE] not in configs:
        raise ConfigError(f"{where}.{BASE}: unknown value {spec[BASE]!r}; allowed: {', '.join(configs)}")
    return merge(resolve(configs, spec[BASE], strict=strict), spec)


def lab_run(name: str, spec: dict, where: str | None = None) -> LabRun:
    """The LabRun of resolved keys (`resolve`); a bad value is a ConfigError naming <where>.<key>."""
    where = where or f"LabConfig.configs.{name}"
    try:
        return LabRun(**{k: v for k, v in spec.items() if k != BASE})
    except ConfigError as exc:
        field_, rest = str(exc).split(":", 1)
        raise ConfigError(f"{where}.{field_.split('.', 1)[-1]}:{rest}") from None
    except TypeError:   # a key LabRun lacks: resolve names it first; this is for a spec that skipped it
        unknown = sorted(k for k in spec if k not in RUN_KEYS and k != BASE)
        raise ConfigError(f"{where}.{unknown[0] if unknown else '?'}: unknown key; allowed: "
                          f"{', '.join(RUN_KEYS)}") from None


def config_run(configs: dict, name: str) -> LabRun:
    """The LabRun lab.configs.<name> runs (its base chain resolved)."""
    return lab_run(name, resolve(configs, name))


MAX_CONFIG_BYTES = 64 * 1024   # a recipe's config file is a few hundred bytes


def read_config_file(path) -> dict:
    """A recipe's config file (reports/labs/explored/<recipe>/config.yaml): a regular file of bounded size, YAML
    within strict_yaml's bounds, a mapping. Each problem is one ConfigError naming the file."""
    from pathlib import Path

    import yaml

    from agentrl.core import files, strict_yaml
    path = Path(path)
    try:
        text = files.decode_utf8(files.read_bytes(path, MAX_CONFIG_BYTES, "a lab config file"), str(path))
        data = strict_yaml.load(text)
    except FileNotFoundError:
        raise ConfigError(f"--config: {path}: file not found") from None
    except (files.InputFileError, strict_yaml.LimitError, strict_yaml.DuplicateKeyError) as exc:
        raise ConfigError(f"--config: {path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"--config: {path}: unreadable ({exc.strerror or type(exc).__name__})") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ConfigError(f"--config: {path}: not valid YAML ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path}: expected a mapping of LabRun keys (and base), got {type(data).__name__}")
    return data


FILE_INSTANCE = "file:"   # how a stage process names an explored recipe's config file as its instance


def instance_spec(lab_section, instance: str | None) -> dict | None:
    """The resolved keys of the lab a stage process runs, from the raw lab section, before anything is validated or
    imported: `instance` is a config's name (--lab), `<name>-<seed>` ($DVC_STAGE's) or file:<path> (--config); None
    where it names no config (the stage refuses it later, in one line)."""
    configs = lab_section.get("configs", LAB_CONFIGS) if isinstance(lab_section, dict) else LAB_CONFIGS
    if not instance or not isinstance(configs, dict):
        return None
    if instance.startswith(FILE_INSTANCE):
        path = instance[len(FILE_INSTANCE):]
        return resolve_spec(read_config_file(path), configs, path)
    name = instance if instance in configs else re.sub(r"-[0-9]+$", "", instance)
    return resolve(configs, name) if name in configs else None


def stage_mode(params: dict, stage: str | None, instance: str | None = None) -> str:
    """The numerics a stage runs under (raw params): run.numerics, except a lab whose config sets its own `numerics`,
    itself or through its base (a real model's GEMMs are several times slower on the portable branch)."""
    mode = (params.get("run") or {}).get("numerics", "portable")
    if stage == "lab" and instance:
        spec = instance_spec(params.get("lab"), instance)
        if isinstance(spec, dict) and spec.get("numerics") is not None:
            mode = spec["numerics"]
    return mode


@dataclass(frozen=True)
class LabConfig(Section):
    """The real-model labs (docs/labs.md): outside the default pipeline (runs is empty by default)."""
    runs: list = knob([], list, "the labs the lab stage runs, names of configs (empty: not in the default pipeline)",
                      item=str, unique=True)
    seeds: list = knob([0], list, "the seeds the lab stage runs each of `runs` at (lab@<lab>-<seed>); every random "
                       "stream of a lab derives from its seed", item=int, **SEED, nonempty=True, unique=True)
    device: str = knob("cpu", str, "where the model and every tensor live", choices=DEVICES)
    eval_batch: int = _int(40, "held-out episodes sampled together", lo=1)
    configs: dict = knob(LAB_CONFIGS, dict, "lab name -> its LabRun keys (the rest take LabRun's defaults), or base: "
                         "<another lab> and the keys it changes; add one with dvc exp run -S "
                         "'+lab.configs.<name>={base: smollm2, lr: 3.0e-5}'", nonempty=True)

    def check(self):
        for name in self.configs:
            config_run(self.configs, name)
        missing = [r for r in self.runs if r not in self.configs]
        if missing:
            raise ConfigError(f"LabConfig.runs: unknown value {missing[0]!r}; allowed: {', '.join(self.configs)}")
