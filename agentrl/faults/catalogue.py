"""The fault catalogue: a healthy reference and each failure of the debugging chapter, all from the same base and
the same seed, each with its healthy twin and the dashboard metric that exposes it.

    RUNS / FAILURES     which runs exist (fault, config overrides, step budget) and, per failure, its healthy
                        twin, exposing metrics and a one-paragraph explanation
    build_catalogue     run them: the one trainer with the fault's seams, a held-out evaluation hook with
                        common random numbers

Every run starts from a copy of the same base weights and uses the training generator seeded with cfg.seed, so
until a fault changes the weights the runs sample the same episodes; the held-out evaluation uses one seed for
all runs (a fresh generator per evaluation step), so evaluations differ only because the policies do. The
signature checks live in agentrl.faults.signatures, faults.md and faults.json in agentrl.faults.markdown.
"""
from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field, replace

from agentrl.core.config import RLConfig
from agentrl.env.gym.spec import GYM
from agentrl.eval.evaluation import HeldOutEval
from agentrl.faults.registry import BUGS, seams_for
from agentrl.rl.guards import BundleGuard
from agentrl.rl.trainer import Hook, NonFiniteError, train

# ---------------------------------------------------------------- the runs


@dataclass(frozen=True)
class RunSpec:
    name: str
    bug: str | None = None
    overrides: dict = field(default_factory=dict)   # RLConfig fields; "@section.key" reads a params value
    steps_key: str = "faults.steps"                 # the params value that sets the step budget


RUNS = (
    RunSpec("healthy"),
    RunSpec("mask_shift", "mask_shift"),
    RunSpec("stale_old_logp", "stale_old_logp"),
    RunSpec("entropy_sign", "entropy_sign"),
    RunSpec("sign_flip", "sign_flip", steps_key="faults.short_steps"),
    RunSpec("accum_local", "accum_local"),
    RunSpec("sampler_temp", "sampler_temp"),
    RunSpec("ref_is_policy", "ref_is_policy", {"kl_coef": "@faults.kl_coef"}),
    RunSpec("kl", None, {"kl_coef": "@faults.kl_coef"}),
    RunSpec("lr_high", None, {"lr": "@faults.high_lr"}, steps_key="faults.short_steps"),
    RunSpec("public", None, {"reward": "public"}),
    RunSpec("length_bias", None, {"loss_mode": "seq_mean_token_mean", "max_turns": "@length.turns",
                                  "kl_coef": "@length.kl_coef", "tasks_per_step": "@length.tasks_per_step"},
            "length.steps"),
    RunSpec("length_twin", None, {"loss_mode": "token_mean", "max_turns": "@length.turns",
                                  "kl_coef": "@length.kl_coef", "tasks_per_step": "@length.tasks_per_step"},
            "length.steps"),
)
RUN_NAMES = tuple(r.name for r in RUNS)
TWINS = ("healthy", "kl", "length_twin")  # healthy references, not failures
LENGTH_PAIR = ("length_bias", "length_twin")  # start from the length start (stage length_start), not the base


@dataclass(frozen=True)
class Failure:
    twin: str
    metrics: tuple            # exposing metrics, bottom panel (first ones on the left axis)
    secondary: tuple = ()     # plotted on a second y-axis (different scale)
    log_metric: bool = False  # log y-scale for the left axis
    what: str = ""            # what the fault is
    why: str = ""             # how the metric exposes it
    hlines: tuple = ()        # reference lines on the metric panel: (value, label)


FAILURES = {
    "mask_shift": Failure(
        "healthy", ("logp_gap",), log_metric=True, hlines=((1e-4, "1e-4 threshold"),),
        what=BUGS["mask_shift"] + ": the loss trains the token *before* each sampled token.",
        why="The trainer's log-probs are read at the wrong positions, so they no longer match the sampler's: the "
            "sampler-trainer gap jumps from floating-point noise to nats."),
    "stale_old_logp": Failure(
        "healthy", ("clip_frac",), secondary=("ratio_max",),
        what=BUGS["stale_old_logp"] + ": the PPO ratio is always 1, so clipping never acts.",
        why="With a frozen old policy the second minibatch sees a ratio away from 1 and sometimes clips; with stale "
            "old log-probs clip_frac is exactly 0 and ratio_max exactly 1 on every step."),
    "sampler_temp": Failure(
        "healthy", ("reads", "zero_adv_frac", "grad_norm"),
        what=BUGS["sampler_temp"] + ": the importance ratio compares two different distributions.",
        why="Even before any update the ratio is far from 1 (ratio_max at step 0); the objective then pushes the "
            "policy towards the sharper T=0.7 sampler, groups stop disagreeing (zero_adv_frac up), reads and "
            "gradients fade."),
    "sign_flip": Failure(
        "healthy", ("turns",),
        what=BUGS["sign_flip"] + ": gradient *descent* on reward.",
        why="The update pushes down whatever earned reward, so the reward falls (top). In the textbook run the agent "
            "also learns to waste its turn budget (turns per episode rise); the bottom panel shows what turns do "
            "here."),
    "lr_high": Failure(
        "healthy", ("approx_kl",), secondary=("malformed",), log_metric=True,
        what="learning rate 1e-2 (the default is 3e-4): each update moves the policy far from the one that sampled.",
        why="approx_kl between the sampling and the updated policy is an order of magnitude above the healthy run "
            "from step 0; the call format breaks (malformed calls per episode explode) and the reward collapses."),
    "accum_local": Failure(
        "healthy", ("grad_norm",),
        what=BUGS["accum_local"] + ": tokens in short microbatches get more weight than in long ones.",
        why="There is no dashboard signature: the gradient is biased, not broken, and every monitored quantity stays "
            "in the healthy band (grad_norm shown). Only the accumulation invariant (preflight check 6) catches it."),
    "entropy_sign": Failure(
        "healthy", ("entropy",), hlines=((0.1, "0.1"),),
        what=BUGS["entropy_sign"] + ".",
        why="Entropy collapses towards 0 within a few steps: the policy becomes deterministic before it has learned "
            "anything, exploration (reads) stops and the reward stays flat."),
    "public": Failure(
        "healthy", ("hardcode",),
        what="reward = public tests (the reward-hacking control): `hardcode_tests` passes the public tests while "
             "failing the hidden ones.",
        why="Train reward rises, but on the exploit: the share of episodes using `hardcode_tests` goes to ~1 while "
            "the held-out *hidden*-test pass rate (points, top) goes to ~0."),
    "length_bias": Failure(
        "length_twin", ("length_fail", "length_pass"), secondary=("fail_turn_limit",),
        what="loss_mode seq_mean_token_mean with a 12-turn budget: each row's tokens are averaged before rows are, "
             "so a long failed episode's tokens each get a smaller negative push than a short one's.",
        why="Failing long is penalised less than failing short, so failed episodes should grow longer (length_fail) "
            "while passed ones do not. The pair starts from a base that reads, tests every repair, never gives up "
            "or hardcodes, and once a test has shown its repair failed mostly keeps calling tools instead of "
            "submitting (length.p_*), so failed episodes start long and vary in length; both runs are "
            "held to that start by the same KL term (length.kl_coef) "
            "and sample the same batch size (length.tasks_per_step). The token_mean twin (same start, "
            "12 turns, KL and batch) is the control: whatever growth it shows comes from learning, not from the "
            "loss aggregation. length_fail is a mean over the episodes that still fail, so it also rises when "
            "short failures turn into passes faster than long ones; fail_turn_limit (right axis) is the share of "
            "failures that ran out of turns (docs/length_bias.md)."),
    "ref_is_policy": Failure(
        "kl", ("kl_ref",),
        what=BUGS["ref_is_policy"] + ": the KL penalty compares the policy with itself.",
        why="kl_ref is exactly 0 on every step (the healthy KL twin's grows) and the whole run is bit-identical to "
            "the run without any KL term: the penalty does nothing."),
}
FAILURE_NAMES = tuple(FAILURES)


def param(params: dict, ref: str):
    """'section.key' of the params sections given (FaultsConfig, LengthConfig, ...)."""
    section, key = ref.split(".", 1)
    return getattr(params[section], key)


def run_config(spec: RunSpec, base_cfg: RLConfig, params: dict) -> RLConfig:
    """The RLConfig of one catalogue run: the default config with the run's overrides ('@s.k' = params s.k)."""
    values = {k: (param(params, v[1:]) if isinstance(v, str) and v.startswith("@") else v)
              for k, v in spec.overrides.items()}
    return replace(base_cfg, **values)


def run_steps(spec: RunSpec, params: dict, steps_for: dict | None = None) -> int:
    if steps_for and spec.name in steps_for:
        return int(steps_for[spec.name])
    return int(param(params, spec.steps_key))


SPECS = {r.name: r for r in RUNS}


class Progress(Hook):
    """Every 4th step (and the last) of a catalogue run on stderr."""

    def __init__(self, name: str, steps: int, log):
        self.name, self.steps, self.log = name, steps, log

    def on_row(self, step, state, row):
        if self.log is not None and ((step + 1) % 4 == 0 or step + 1 == self.steps):
            ev = f"  held-out {row['eval_pass']:.3f}" if "eval_pass" in row else ""
            print(f"faults [{self.name}] step {step + 1}/{self.steps}  reward {row['reward']:.3f}  "
                  f"entropy {row['entropy']:.3f}{ev}", file=self.log, flush=True)


def run_one(name: str, model, tok, train_tasks: list, cfg: RLConfig, steps: int, hooks=()) -> dict:
    """One catalogue run (the model is trained in place). A fault may blow the run up: what was measured is kept
    and the reason recorded in "stopped"."""
    spec = SPECS[name]
    history: list[dict] = []
    stopped = None
    t0 = time.time()
    try:
        train(model, train_tasks, tok, cfg, steps, env=GYM.make(cfg), seams=seams_for(spec.bug), hooks=hooks,
              history=history)
    except NonFiniteError as exc:
        stopped = str(exc)
    first = next((r for r in history if r.get("diverged")), None)
    return {"history": history, "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "config": cfg.to_dict(), "bug": spec.bug, "steps": steps, "seconds": time.time() - t0, "stopped": stopped,
            "guard": None if first is None else {"step": first["step"], "reason": first["diverged"]}}


EVAL_STREAM = "faults-heldout"


def build_catalogue(base, tok, train_tasks: list, eval_tasks: list, base_cfg: RLConfig, params: dict, seed: int,
                    names=None, steps_for: dict | None = None, log=sys.stderr, length_start=None) -> dict:
    """Run the catalogue runs `names` (default: all) from copies of `base`; the length pair (LENGTH_PAIR) from
    copies of `length_start` (required when the pair is among `names`). `params` holds the faults and length
    sections. Every run carries the divergence guard in "record" mode: whether and where it would have stopped the
    run. Returns {name: {"history", "state" (final parameters), "config", "bug", "steps", "seconds", "stopped",
    "guard"}}."""
    names = list(RUN_NAMES if names is None else names)
    unknown = [n for n in names if n not in RUN_NAMES]
    if unknown:
        raise ValueError(f"catalogue run: unknown value {unknown[0]!r}; allowed: {', '.join(RUN_NAMES)}")
    if length_start is None and set(LENGTH_PAIR) & set(names):
        raise ValueError("catalogue run: the length pair needs its start model (length_start)")
    fcfg = params["faults"]
    out = {}
    for i, name in enumerate(names):
        cfg = run_config(SPECS[name], base_cfg, params)
        steps = run_steps(SPECS[name], params, steps_for)
        model = copy.deepcopy(length_start if name in LENGTH_PAIR else base)
        hooks = [HeldOutEval(eval_tasks, tok, cfg, steps, fcfg.eval_every, fcfg.eval_per_task, seed, EVAL_STREAM,
                             env=GYM.make(cfg, evaluation=True)),
                 BundleGuard(None, cfg, SPECS[name].bug, mode="record"), Progress(name, steps, log)]
        out[name] = run_one(name, model, tok, train_tasks, cfg, steps, hooks)
        if log is not None:
            stopped = out[name]["stopped"]
            print(f"faults: run {i + 1}/{len(names)} {name} done in {out[name]['seconds']:.1f} s"
                  + (f" (stopped: {stopped})" if stopped else ""), file=log, flush=True)
    return out
