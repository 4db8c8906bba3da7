"""The rl section of params.yaml: GRPO's knobs (agentrl.rl.trainer), in a module of its own so the lab section
(agentrl.core.lab_config) can check a lab's `rl` overrides against it."""
from __future__ import annotations

from dataclasses import dataclass

from agentrl.core.knobs import ConfigError, Section, knob, prob
from agentrl.core.knobs import int_knob as _int
from agentrl.core.variants import (
    ADV_ESTIMATORS,
    CURRICULA,
    KEEP_MODES,
    KL_KINDS,
    LOSS_MODES,
    LR_SCHEDULES,
    POLICY_LOSSES,
    RATIO_LEVELS,
    REWARD_SCALES,
    TASK_DRAWS,
)

REWARDS = ("hidden", "public")
SEED_MAX = 2**64 - 1   # torch.Generator.manual_seed takes at most 64 bits
SEED = {"lo": 0, "hi": SEED_MAX}
CLIP = {"lo": 0.0, "hi": 1.0, "lo_open": True, "hi_open": True}   # a clip range below 1: ratio >= 1 - eps > 0


@dataclass(frozen=True)
class RLConfig(Section):
    """GRPO (agentrl.rl.trainer); the seed is run.seed."""
    group_size: int = _int(8, "episodes per task (the GRPO group; two or more to compare)", lo=2)
    tasks_per_step: int = _int(8, "groups per step: 64 episodes", lo=1)
    lr: float = knob(3e-4, float, "Adam; 1e-3 takes ~10x larger steps on this parametrization (docs/deviations.md)",
                     lo=0.0, lo_open=True)
    epochs: int = _int(1, "passes over the batch per step", lo=1)
    minibatches: int = _int(2, "optimizer steps per epoch", lo=1)
    microbatches: int = _int(1, "gradient accumulation inside a minibatch (token-weighted, exact)", lo=1)
    clip_eps: float = knob(0.2, float, "the clip range on both sides (clip_eps_low/high override a side)", **CLIP)
    max_grad_norm: float = knob(1.0, float, lo=0.0, lo_open=True)
    temperature: float = knob(1.0, float, "sampling temperature", lo=0.0, lo_open=True)
    kl_coef: float = knob(0.0, float, "KL to the frozen starting policy (0 = no reference)", lo=0.0)
    kl_kind: str = knob("k3", str, choices=KL_KINDS)
    entropy_coef: float = knob(0.0, float)
    policy_loss: str = knob("clip", str, "the per-token policy term: clip is PPO's clipped surrogate (with dual clip "
                            "when clip_ratio_c is set)", choices=POLICY_LOSSES)
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
    p_rename_operands: float = prob(0.0, "this share of training episodes shows the source's operands under filler "
                                    "names drawn per episode (in the gym's read; in the coding environment's file); "
                                    "an evaluation always shows the authored source")
    seed: int = _int(0, "run.seed (not an rl key)", **SEED)
    # research knobs (docs/research.md); at their defaults a run is bit-identical to plain GRPO above
    clip_eps_low: float | None = knob(None, float, "clip range below 1: ratio >= 1 - this (null: clip_eps)", **CLIP,
                                      nullable=True)
    clip_eps_high: float | None = knob(None, float, "clip range above 1 (DAPO clip-higher, e.g. 0.28; null: clip_eps)",
                                       lo=0.0, lo_open=True, nullable=True)
    clip_ratio_c: float | None = knob(None, float, "dual clip: for A < 0 a token's loss is at most c * |A| (null: off)",
                                      lo=1.0, lo_open=True, nullable=True)
    ratio_level: str = knob("token", str, "one importance ratio per token, or per sequence (GSPO)",
                            choices=RATIO_LEVELS)
    adv_estimator: str = knob("grpo", str, "baseline: the group mean, or the mean of the group's other episodes",
                              choices=ADV_ESTIMATORS)
    scale_rewards: str | None = knob(None, str, "divide advantages by the reward std of the group or the batch "
                                     "(null: group if adv_std_scale, else none)", choices=REWARD_SCALES, nullable=True)
    resample_cap: int = _int(4, "keep: resample draws at most this many x tasks_per_step groups per step", lo=1)
    lr_warmup: int = _int(0, "the first this-many steps ramp the learning rate linearly up to lr", lo=0)
    lr_schedule: str = knob("constant", str, "after warmup: constant, or linear / cosine decay to 0 at the last step",
                            choices=LR_SCHEDULES)
    entropy_target: float | None = knob(None, float, "adapt the entropy coefficient (from entropy_coef, >= 0) to hold "
                                        "the mean token entropy near this many nats (null: fixed)", lo=0.0,
                                        lo_open=True, nullable=True)
    entropy_coef_lr: float = knob(0.1, float, "entropy target: per step the coefficient moves by this x (target - "
                                  "entropy)", lo=0.0, lo_open=True)
    curriculum: str = knob("none", str, "pass_rate: sample tasks with weight p(1-p) of their recent pass rate p",
                           choices=CURRICULA)
    curriculum_window: int = _int(10, "curriculum: the pass rate of the last this-many steps (Laplace-smoothed)",
                                  lo=1)
    task_draw: str = knob("uniform", str, "a step's distinct tasks: uniform, or families (one task per family in "
                          "turn, so a step's groups spread evenly over the task families)", choices=TASK_DRAWS)

    def check(self):
        if self.group_size * self.tasks_per_step < self.minibatches:
            raise ConfigError(f"RLConfig.minibatches: {self.minibatches} exceeds the batch "
                              f"({self.group_size * self.tasks_per_step} episodes)")
        if self.adv_std_scale and self.scale_rewards not in (None, "group"):
            raise ConfigError(f"RLConfig.scale_rewards: {self.scale_rewards!r} contradicts adv_std_scale=true (its "
                              "shorthand for 'group'); set one of them")
        if self.task_draw != "uniform" and self.curriculum != "none":
            raise ConfigError(f"RLConfig.task_draw: {self.task_draw} draws tasks by family and takes no curriculum "
                              f"weights; with curriculum: {self.curriculum} allowed: uniform")

    @property
    def clip_range(self) -> tuple[float, float]:
        """(low, high): the ratio is clipped to [1 - low, 1 + high]; clip_eps is the shorthand for both."""
        return (self.clip_eps if self.clip_eps_low is None else self.clip_eps_low,
                self.clip_eps if self.clip_eps_high is None else self.clip_eps_high)

    @property
    def reward_scale(self) -> str:
        """none, group or batch: scale_rewards, or its shorthand adv_std_scale."""
        return self.scale_rewards or ("group" if self.adv_std_scale else "none")
