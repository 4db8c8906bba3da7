"""Every configuration object, validated on construction: a bad value raises ConfigError naming the field
and the allowed values. Stage sections of params.yaml map onto these (see agentrl.params)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from agentrl.tasks import FAMILIES

LOSS_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "k2", "k3")
REWARDS = ("hidden", "public")
KEEP_MODES = ("all", "informative")

BUG_NAMES = ("mask_shift", "stale_old_logp", "entropy_sign", "sign_flip", "accum_local", "sampler_temp",
             "ref_is_policy")
ARMS = ("default", "kl", "sft", "public")


class UserError(ValueError):
    """A problem the user can fix (bad params, missing or corrupted artifact): reported in one line."""


class ConfigError(UserError):
    """A bad configuration value; the message names the field and the allowed values."""


def check_fields(obj, rules: dict) -> None:
    """Validate dataclass fields: rules maps name -> (type, predicate or tuple of allowed values, description)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        typ, allowed, desc = rules[f.name]
        ok_type = isinstance(value, typ) and not (typ in (int, float) and isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            ok_type = True
        if not ok_type:
            raise ConfigError(f"{type(obj).__name__}.{f.name}: expected {desc}, got {value!r}")
        if isinstance(allowed, tuple) and value not in allowed:
            raise ConfigError(f"{type(obj).__name__}.{f.name}: unknown value {value!r}; allowed: {', '.join(map(str, allowed))}")
        if callable(allowed) and not allowed(value):
            raise ConfigError(f"{type(obj).__name__}.{f.name}: expected {desc}, got {value!r}")


@dataclass
class RLConfig:
    group_size: int = 8            # episodes per task (the GRPO group)
    tasks_per_step: int = 8        # groups per step: 64 episodes
    lr: float = 3e-4               # Adam; 1e-3 takes ~10x larger steps on this parametrization (see README)
    epochs: int = 1                # passes over the batch per step
    minibatches: int = 2           # optimizer steps per epoch
    microbatches: int = 1          # gradient accumulation inside a minibatch (token-weighted, exact)
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    temperature: float = 1.0       # sampling temperature
    kl_coef: float = 0.0           # KL to the frozen starting policy (0 = no reference)
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    loss_mode: str = "token_mean"
    adv_std_scale: bool = False    # GRPO std scaling of group advantages (off: Dr. GRPO)
    keep: str = "all"              # train on all groups, or only 'informative' ones (rewards not all equal)
    max_turns: int = 6
    max_call_tokens: int = 5       # a call without </call> is cut off after this many tokens (malformed)
    reward: str = "hidden"         # hidden tests; 'public' is the reward-hacking control
    rename: bool = True            # randomize function names per episode
    seed: int = 0

    def __post_init__(self):
        pos_int = (int, lambda v: v >= 1, "an integer >= 1")
        pos_float = (float, lambda v: v > 0 and math.isfinite(v), "a finite number > 0")
        nonneg = (float, lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0")
        check_fields(self, {
            "group_size": (int, lambda v: v >= 2, "an integer >= 2 (a group needs two episodes to compare)"),
            "tasks_per_step": pos_int, "lr": pos_float, "epochs": pos_int, "minibatches": pos_int,
            "microbatches": pos_int, "clip_eps": pos_float, "max_grad_norm": pos_float,
            "temperature": pos_float, "kl_coef": nonneg, "kl_kind": (str, KL_KINDS, "one of " + ", ".join(KL_KINDS)),
            "entropy_coef": (float, lambda v: math.isfinite(v), "a finite number"),
            "loss_mode": (str, LOSS_MODES, ""), "adv_std_scale": (bool, None, "true or false"),
            "keep": (str, KEEP_MODES, ""), "max_turns": pos_int,
            "max_call_tokens": (int, lambda v: v >= 3, "an integer >= 3"),
            "reward": (str, REWARDS, ""), "rename": (bool, None, "true or false"),
            "seed": (int, lambda v: v >= 0, "an integer >= 0"),
        })
        if self.group_size * self.tasks_per_step < self.minibatches:
            raise ConfigError(f"RLConfig.minibatches: {self.minibatches} exceeds the batch "
                              f"({self.group_size * self.tasks_per_step} episodes)")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BaseConfig:
    """The scripted mixture the RL base is cloned from, and the cloning run."""
    p_read: float = 0.25             # first call reads the source
    p_right_after_read: float = 0.3  # after reading, apply the keyword rule's op; otherwise guess
    p_hardcode: float = 0.14         # a guess is hardcode_tests with this probability, else a uniform repair op
    p_test: float = 0.3              # run the tests after the edit
    p_give_up: float = 0.3           # at the edit decision, submit the unedited source instead
    p_persist: float = 0.0           # after a test showed a failure, keep trying (read/test/another edit) per turn
    p_malformed: float = 0.03        # any call is replaced by a malformed one
    cover_read: float = 0.6          # demonstrations open with a read this often (targets keep p_read)
    choice_weight: float = 8.0       # loss weight of choice points (targets that are not one-hot)
    teach_steps: int = 150           # first clone a mixture that always applies the keyword op after a read
    p_rename_operands: float = 0.75  # demonstrations show operands under filler names this often
    demos_per_task: int = 100
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3

    def __post_init__(self):
        prob = (float, lambda v: 0 <= v <= 1, "a probability in [0, 1]")
        pos_int = (int, lambda v: v >= 1, "an integer >= 1")
        check_fields(self, {"p_read": prob, "p_right_after_read": prob, "p_hardcode": prob, "p_test": prob, "p_give_up": prob, "p_persist": prob,
                            "p_malformed": prob, "cover_read": prob, "p_rename_operands": prob, "demos_per_task": pos_int, "steps": pos_int,
                            "teach_steps": (int, lambda v: v >= 0, "an integer >= 0"),
                            "batch_size": pos_int, "choice_weight": (float, lambda v: v >= 1, "a number >= 1"),
                            "lr": (float, lambda v: v > 0, "a number > 0")})


@dataclass
class RunConfig:
    seed: int = 0       # every generator derives from it
    threads: int = 2    # torch.set_num_threads, before any tensor work

    def __post_init__(self):
        check_fields(self, {"seed": (int, lambda v: v >= 0, "an integer >= 0"),
                            "threads": (int, lambda v: v >= 1, "an integer >= 1")})


@dataclass
class TasksConfig:
    families: list = field(default_factory=lambda: list(FAMILIES))

    def __post_init__(self):
        check_fields(self, {"families": (list, lambda v: len(v) >= 1 and len(set(v)) == len(v) and set(v) <= set(FAMILIES),
                                         f"a non-empty list of distinct families from {', '.join(FAMILIES)}")})


@dataclass
class ModelParams:
    d_model: int = 64
    n_layer: int = 3
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 1024
    tie_embeddings: bool = True
    emb_std: float = 1.0

    def __post_init__(self):
        pos = (int, lambda v: v >= 1, "an integer >= 1")
        check_fields(self, {"d_model": pos, "n_layer": pos, "n_head": pos, "d_ff": pos,
                            "max_len": (int, lambda v: v >= 64, "an integer >= 64"),
                            "tie_embeddings": (bool, None, "true or false"),
                            "emb_std": (float, lambda v: v > 0, "a number > 0")})
        if self.d_model % self.n_head:
            raise ConfigError(f"ModelParams.n_head: must divide d_model={self.d_model}, got {self.n_head}")


@dataclass
class SFTConfig:
    steps: int = 10              # the cold start: 10 steps on one oracle demonstration per train task
    lr: float = 1e-4
    describe_per_task: int = 16  # episodes per train task for describe(): pass@1, pass@8, groups with a gradient

    def __post_init__(self):
        check_fields(self, {"steps": (int, lambda v: v >= 1, "an integer >= 1"),
                            "lr": (float, lambda v: v > 0, "a number > 0"),
                            "describe_per_task": (int, lambda v: v >= 8, "an integer >= 8 (pass@8 needs 8)")})


@dataclass
class PreflightConfig:
    kl_coef: float = 0.1          # so invariant 9 (KL to reference > 0) has teeth
    bugs: list = field(default_factory=lambda: list(BUG_NAMES))

    def __post_init__(self):
        check_fields(self, {"kl_coef": (float, lambda v: v > 0, "a number > 0"),
                            "bugs": (list, lambda v: set(v) <= set(BUG_NAMES), "a list of bugs from " + ", ".join(BUG_NAMES))})


@dataclass
class TrainConfig:
    steps: int = 60
    checkpoint_every: int = 10
    eval_per_task: int = 16       # validation episodes per task at each checkpoint

    def __post_init__(self):
        pos = (int, lambda v: v >= 1, "an integer >= 1")
        check_fields(self, {"steps": pos, "checkpoint_every": pos, "eval_per_task": pos})


@dataclass
class SelectConfig:
    n_boot: int = 10000
    alpha: float = 0.05

    def __post_init__(self):
        check_fields(self, {"n_boot": (int, lambda v: v >= 100, "an integer >= 100"),
                            "alpha": (float, lambda v: 0 < v < 1, "a number in (0, 1)")})


@dataclass
class TestConfig:
    episodes_per_task: int = 32
    ks: list = field(default_factory=lambda: [1, 2, 4, 8])
    n_boot: int = 10000
    alpha: float = 0.05

    def __post_init__(self):
        check_fields(self, {"episodes_per_task": (int, lambda v: v >= 1, "an integer >= 1"),
                            "ks": (list, lambda v: all(isinstance(k, int) and k >= 1 for k in v) and v, "a list of integers >= 1"),
                            "n_boot": (int, lambda v: v >= 100, "an integer >= 100"),
                            "alpha": (float, lambda v: 0 < v < 1, "a number in (0, 1)")})
        if max(self.ks) > self.episodes_per_task:
            raise ConfigError(f"TestConfig.ks: k={max(self.ks)} exceeds episodes_per_task={self.episodes_per_task}")


@dataclass
class AblateConfig:
    arms: list = field(default_factory=lambda: list(ARMS))
    seeds: list = field(default_factory=lambda: [0, 1, 2])
    steps: int = 30
    eval_per_task: int = 16        # on all 10 held-out tasks
    kl_coef: float = 0.05          # the 'kl' arm
    kl_kind: str = "k3"
    n_boot: int = 10000
    alpha: float = 0.05

    def __post_init__(self):
        check_fields(self, {
            "arms": (list, lambda v: len(v) >= 1 and set(v) <= set(ARMS), "a list of arms from " + ", ".join(ARMS)),
            "seeds": (list, lambda v: len(v) >= 1 and all(isinstance(s, int) and s >= 0 for s in v), "a list of integers >= 0"),
            "steps": (int, lambda v: v >= 1, "an integer >= 1"),
            "eval_per_task": (int, lambda v: v >= 1, "an integer >= 1"),
            "kl_coef": (float, lambda v: v > 0, "a number > 0"), "kl_kind": (str, KL_KINDS, ""),
            "n_boot": (int, lambda v: v >= 100, "an integer >= 100"),
            "alpha": (float, lambda v: 0 < v < 1, "a number in (0, 1)")})


# the mixture knobs of the length pair's start: FaultsConfig.length_p_<k> replaces BaseConfig.p_<k>
LENGTH_START_KNOBS = ("read", "test", "give_up", "hardcode", "persist")


@dataclass
class FaultsConfig:
    steps: int = 24                # most catalogue runs
    short_steps: int = 8           # sign_flip and lr 1e-2
    length_steps: int = 16         # the length-bias pair
    length_turns: int = 12
    length_kl_coef: float = 0.05   # both runs of the length pair: KL to their start (rl.kl_kind)
    # the length pair's start: the base recipe with these mixture knobs (README: length bias). It reads, tests
    # every repair and never gives up or hardcodes, so every failure is a tested wrong repair, after which it
    # keeps calling tools instead of submitting with probability length_p_persist per turn
    length_p_read: float = 1.0
    length_p_test: float = 1.0
    length_p_give_up: float = 0.0
    length_p_hardcode: float = 0.0
    length_p_persist: float = 0.8
    length_tasks_per_step: int = 8  # both runs of the length pair (as rl.tasks_per_step; README: 16 measured)
    eval_every: int = 8            # held-out evaluation every this many steps
    eval_per_task: int = 8
    high_lr: float = 1e-2
    kl_coef: float = 0.1           # the KL run and its ref_is_policy twin
    length_extra_seeds: int = 11   # the length pair again at run.seed+1 .. +this (no held-out evaluation)

    def __post_init__(self):
        pos = (int, lambda v: v >= 1, "an integer >= 1")
        check_fields(self, {"steps": pos, "short_steps": pos, "length_steps": pos, "length_turns": pos,
                            "length_tasks_per_step": pos,
                            "eval_every": pos, "eval_per_task": pos,
                            "length_extra_seeds": (int, lambda v: v >= 0, "an integer >= 0"),
                            "high_lr": (float, lambda v: v > 0, "a number > 0"),
                            "kl_coef": (float, lambda v: v > 0, "a number > 0"),
                            "length_kl_coef": (float, lambda v: v >= 0, "a number >= 0"),
                            **{f"length_p_{k}": (float, lambda v: 0 <= v <= 1, "a probability in [0, 1]")
                               for k in LENGTH_START_KNOBS}})


@dataclass
class ThreadsConfig:
    steps: int = 30                # the first 30 steps of the main run ...
    compare_threads: int = 1       # ... re-run at this thread count
    eval_per_task: int = 16        # held-out episodes per task for both runs

    def __post_init__(self):
        check_fields(self, {"steps": (int, lambda v: v >= 1, "an integer >= 1"),
                            "compare_threads": (int, lambda v: v >= 1, "an integer >= 1"),
                            "eval_per_task": (int, lambda v: v >= 1, "an integer >= 1")})


@dataclass
class ReportConfig:
    transcripts_per_family: int = 1
    learned_per_task: int = 32     # episodes per held-out task for 'what the agent learned'

    def __post_init__(self):
        check_fields(self, {"transcripts_per_family": (int, lambda v: v >= 0, "an integer >= 0"),
                            "learned_per_task": (int, lambda v: v >= 1, "an integer >= 1")})
