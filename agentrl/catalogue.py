"""The fault catalogue (SPEC §8 item 9): a healthy reference and each failure of §6, all from the same base and
the same seed, each with the dashboard metric that exposes it and a check that its signature shows.

Read top to bottom:
  RUNS / FAILURES        which runs exist (config overrides, step budget) and, per failure, its healthy twin,
                         exposing metrics and a one-paragraph explanation
  build_catalogue(...)   run them (instrumented trainer, held-out evaluation with common random numbers)
  signature_checks(...)  the measured signatures, each with the criterion, the values and pass/fail
  summarize / render_markdown / figure_specs   what the stage writes

Every run starts from a copy of the same base weights and uses the training generator seeded with cfg.seed, so
until a fault changes the weights the runs sample the same episodes; the held-out evaluation uses one eval_seed
for all runs (a fresh generator per evaluation step), so evaluations differ only because the policies do.
"""
from __future__ import annotations

import copy
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, fields, replace

import torch

from agentrl.config import LENGTH_START_KNOBS
from agentrl.diagnostics import BUGS, NonFiniteError, train_logged
from agentrl.stats import bootstrap_ci, paired_bootstrap_diff
from agentrl.trainer import RLConfig

# ---------------------------------------------------------------- the runs


@dataclass(frozen=True)
class RunSpec:
    name: str
    bug: str | None = None
    overrides: dict = field(default_factory=dict)   # RLConfig fields; values may name a FaultsConfig field
    steps_key: str = "steps"                        # which FaultsConfig field sets the step budget


RUNS = (
    RunSpec("healthy"),
    RunSpec("mask_shift", "mask_shift"),
    RunSpec("stale_old_logp", "stale_old_logp"),
    RunSpec("entropy_sign", "entropy_sign"),
    RunSpec("sign_flip", "sign_flip", steps_key="short_steps"),
    RunSpec("accum_local", "accum_local"),
    RunSpec("sampler_temp", "sampler_temp"),
    RunSpec("ref_is_policy", "ref_is_policy", {"kl_coef": "@kl_coef"}),
    RunSpec("kl", None, {"kl_coef": "@kl_coef"}),
    RunSpec("lr_high", None, {"lr": "@high_lr"}, steps_key="short_steps"),
    RunSpec("public", None, {"reward": "public"}),
    RunSpec("length_bias", None, {"loss_mode": "seq_mean_token_mean", "max_turns": "@length_turns",
                                  "kl_coef": "@length_kl_coef", "tasks_per_step": "@length_tasks_per_step"},
            "length_steps"),
    RunSpec("length_twin", None, {"loss_mode": "token_mean", "max_turns": "@length_turns",
                                  "kl_coef": "@length_kl_coef", "tasks_per_step": "@length_tasks_per_step"},
            "length_steps"),
)
RUN_NAMES = tuple(r.name for r in RUNS)
TWINS = ("healthy", "kl", "length_twin")  # healthy references, not failures
LENGTH_PAIR = ("length_bias", "length_twin")  # start from the length start (length_start_config), not the base


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
            "also learns to waste its turn budget (turns per episode rise); the bottom panel shows what turns do here."),
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
            "submitting (faults.length_p_*), so failed episodes start long and vary in length; both runs are "
            "held to that start by the same KL term (faults.length_kl_coef) "
            "and sample the same batch size (faults.length_tasks_per_step). The token_mean twin (same start, "
            "12 turns, KL and batch) is the control: whatever growth it shows comes from learning, not from the "
            "loss aggregation. length_fail is a mean over the episodes that still fail, so it also rises when "
            "short failures turn into passes faster than long ones; fail_turn_limit (right axis) is the share of "
            "failures that ran out of turns (README: length bias)."),
    "ref_is_policy": Failure(
        "kl", ("kl_ref",),
        what=BUGS["ref_is_policy"] + ": the KL penalty compares the policy with itself.",
        why="kl_ref is exactly 0 on every step (the healthy KL twin's grows) and the whole run is bit-identical to "
            "the run without any KL term: the penalty does nothing."),
}
FAILURE_NAMES = tuple(FAILURES)


def run_config(spec: RunSpec, base_cfg: RLConfig, fcfg) -> RLConfig:
    """The RLConfig of one catalogue run: the default config with the run's overrides ('@x' = faults.x)."""
    values = {k: (getattr(fcfg, v[1:]) if isinstance(v, str) and v.startswith("@") else v)
              for k, v in spec.overrides.items()}
    return replace(base_cfg, **values)


def length_start_config(base_cfg, fcfg):
    """The BaseConfig of the length pair's start: the RL base's recipe with the mixture knobs p_read, p_test,
    p_give_up, p_hardcode and p_persist taken from faults.length_p_*. The defaults read and test every repair and
    never give up or hardcode, so every failure is a tested wrong repair that then either submits or keeps
    calling tools (p_persist per turn): short and long failures both start common, and no kind of short failure
    is one that learning removes by itself. Built by make_rl_base with the base stage's seed."""
    return replace(base_cfg, **{f"p_{k}": getattr(fcfg, f"length_p_{k}") for k in LENGTH_START_KNOBS})


def run_steps(spec: RunSpec, fcfg, steps_for: dict | None = None) -> int:
    if steps_for and spec.name in steps_for:
        return int(steps_for[spec.name])
    return int(getattr(fcfg, spec.steps_key))


# ---------------------------------------------------------------- running

def build_catalogue(base, tok, train_tasks: list, eval_tasks: list, base_cfg: RLConfig, fcfg, eval_seed: int,
                    names=None, steps_for: dict | None = None, log=sys.stderr, length_start=None) -> dict:
    """Run the catalogue runs `names` (default: all) from copies of `base`; the length pair (LENGTH_PAIR) from
    copies of `length_start` (required when the pair is among `names`).
    Returns {name: {"history", "state" (final parameters), "config", "bug", "steps", "seconds", "stopped"}}."""
    names = list(RUN_NAMES if names is None else names)
    unknown = [n for n in names if n not in RUN_NAMES]
    if unknown:
        raise ValueError(f"catalogue run: unknown value {unknown[0]!r}; allowed: {', '.join(RUN_NAMES)}")
    if length_start is None and set(LENGTH_PAIR) & set(names):
        raise ValueError("catalogue run: the length pair needs its start model (length_start)")
    specs = {r.name: r for r in RUNS}
    out = {}
    for i, name in enumerate(names):
        spec = specs[name]
        cfg = run_config(spec, base_cfg, fcfg)
        steps = run_steps(spec, fcfg, steps_for)
        model = copy.deepcopy(length_start if name in LENGTH_PAIR else base)
        history: list[dict] = []
        stopped = None
        t0 = time.time()

        def progress(row, name=name, steps=steps):
            if log is not None and ((row["step"] + 1) % 4 == 0 or row["step"] + 1 == steps):
                ev = f"  held-out {row['eval_pass']:.3f}" if "eval_pass" in row else ""
                print(f"faults [{name}] step {row['step'] + 1}/{steps}  reward {row['reward']:.3f}  "
                      f"entropy {row['entropy']:.3f}{ev}", file=log, flush=True)
        try:
            train_logged(model, train_tasks, tok, cfg, steps, bug=spec.bug, eval_tasks=eval_tasks,
                         eval_every=fcfg.eval_every, eval_per_task=fcfg.eval_per_task, eval_seed=eval_seed,
                         history=history, progress=progress)
        except NonFiniteError as exc:  # a fault may blow the run up: keep what was measured and say so
            stopped = str(exc)
        seconds = time.time() - t0
        out[name] = {"history": history, "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                     "config": cfg.to_dict(), "bug": spec.bug, "steps": steps, "seconds": seconds,
                     "stopped": stopped}
        if log is not None:
            print(f"faults: run {i + 1}/{len(names)} {name} done in {seconds:.1f} s"
                  + (f" (stopped: {stopped})" if stopped else ""), file=log, flush=True)
    return out


def length_seed_sweep(length_start, tok, train_tasks: list, base_cfg: RLConfig, fcfg, seeds,
                      log=sys.stderr) -> list[dict]:
    """The length pair (length_bias and its twin from copies of `length_start`, without held-out evaluation,
    which never touches training) again at each of `seeds`: per seed the failed- and passed-episode length
    changes of both runs and whether the signature holds, measured exactly as the catalogue's own check does."""
    specs = {r.name: r for r in RUNS}
    rows = []
    for seed in seeds:
        t0 = time.time()
        hist = {}
        for name in LENGTH_PAIR:
            cfg = replace(run_config(specs[name], base_cfg, fcfg), seed=int(seed))
            hist[name] = train_logged(copy.deepcopy(length_start), train_tasks, tok, cfg, run_steps(specs[name], fcfg))
        f, t = hist["length_bias"], hist["length_twin"]
        k = _window(min(len(f), len(t)))
        row = {"seed": int(seed), "window": k, "steps": len(f)}
        for side, h in (("faulty", f), ("twin", t)):
            for key in ("length_fail", "length_pass"):
                short = key.split("_")[1]
                row[f"{side}_{short}_start"] = end_mean(h, key, k, start=True)
                row[f"{side}_{short}_end"] = end_mean(h, key, k)
                row[f"{side}_{short}_change"] = _delta(h, key, k)
            row[f"{side}_reward_end"] = end_mean(h, "reward", k)
        row["holds"] = length_signature(row["faulty_fail_change"], row["twin_fail_change"])
        rows.append(row)
        if log is not None:
            print(f"faults: length pair at seed {seed}: length_fail change {_fmt(row['faulty_fail_change'])} vs "
                  f"twin {_fmt(row['twin_fail_change'])} ({time.time() - t0:.1f} s)", file=log, flush=True)
    return rows


def _length_pairs(rows: list[dict], main: dict | None = None) -> list[tuple]:
    """(faulty, twin) failed-episode length changes per seed: the sweep's rows, then the catalogue's own
    length_bias result if given."""
    pairs = [(r["faulty_fail_change"], r["twin_fail_change"]) for r in rows]
    if main is not None:
        c = main["checks"][0]
        pairs.append((c["faulty"], c["healthy"]))
    return pairs


def length_sweep_summary(rows: list[dict], main: dict | None = None) -> dict:
    """Counts over the sweep's seeds, plus (if given) the catalogue's own length_bias check as one more seed."""
    pairs = _length_pairs(rows, main)
    ok = [(df, dt) for df, dt in pairs if _num(df, dt)]
    return {"seeds": len(pairs),
            "faulty_grows": sum(df >= ONE_CALL_TOKENS for df, _ in ok),
            "faulty_above_twin": sum(df > dt for df, dt in ok),
            "twin_flat": sum(dt < ONE_CALL_TOKENS for _, dt in ok),
            "holds": sum(length_signature(df, dt) for df, dt in ok)}


def length_sweep_note(rows: list[dict], main_seed: int, main: dict | None = None) -> str:
    """Markdown for the length_bias section: the pair at further seeds, and the counts including the main seed."""
    if not rows:
        return ""
    s = length_sweep_summary(rows, main)
    n = s["seeds"]
    L = [f"**Across seeds.** The same pair at seeds {', '.join(str(r['seed']) for r in rows)} (training only; "
         f"the catalogue's own runs use seed {main_seed}). Over all {n} seeds the faulty run's failed episodes grow "
         f"by at least one call at {s['faulty_grows']}/{n} and more than the twin's at {s['faulty_above_twin']}/{n}; "
         f"the twin's stay within one call at {s['twin_flat']}/{n}; the whole signature holds at {s['holds']}/{n}.",
         "", "| seed | length_fail, faulty | length_fail, twin | length_pass change, faulty / twin | "
         "train reward at the end, faulty / twin | signature holds |", "|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['seed']} | {_fmt(r['faulty_fail_start'])} → {_fmt(r['faulty_fail_end'])} "
                 f"({_signed(r['faulty_fail_change'])}) | {_fmt(r['twin_fail_start'])} → {_fmt(r['twin_fail_end'])} "
                 f"({_signed(r['twin_fail_change'])}) | {_signed(r['faulty_pass_change'])} / "
                 f"{_signed(r['twin_pass_change'])} | {_fmt(r['faulty_reward_end'])} / {_fmt(r['twin_reward_end'])} | "
                 f"{'yes' if r['holds'] else '**no**'} |")
    return "\n".join(L)


def _signed(v) -> str:
    return "—" if not _finite(v) else f"{v:+.3g}"


# ---------------------------------------------------------------- reading a history

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def series(history: list, key: str) -> list:
    return [r.get(key) for r in history]


def eval_points(history: list) -> list[tuple[int, float]]:
    """(updates done, held-out pass rate) for every evaluation in the run: step 0 and after step+1 updates."""
    pts = []
    if history and "eval_pass_start" in history[0]:
        pts.append((0, history[0]["eval_pass_start"]))
    pts += [(r["step"] + 1, r["eval_pass"]) for r in history if "eval_pass" in r]
    return pts


def eval_at(history: list, updates: int):
    """The held-out pass rate after `updates` updates (None if not evaluated then)."""
    return dict(eval_points(history)).get(updates)


def end_mean(history: list, key: str, k: int = 4, start: bool = False):
    """Mean of the first (start=True) or last k finite values of `key`."""
    vals = [v for v in series(history, key) if _finite(v)]
    if not vals:
        return None
    part = vals[:k] if start else vals[-k:]
    return sum(part) / len(part)


def _window(n: int) -> int:
    """Steps averaged at each end of a run: 4, or a quarter of a short run (at least 1)."""
    return max(1, min(4, n // 4))


def at(history: list, key: str, step: int = 0):
    return history[step].get(key) if len(history) > step else None


# ---------------------------------------------------------------- the signature checks
#
# A check is {"metric", "statistic", "faulty", "healthy", "criterion", "holds", "kind", ...}. kind "required":
# the signatures the catalogue must show (asserted in tests/test_faults.py); kind "reference": the SPEC §6
# reference mechanism, measured on the full-length runs and reported honestly either way. "healthy" is the twin's
# value over the same steps as the faulty run (the twin truncated to the faulty run's length).

def _check(metric: str, statistic: str, faulty, healthy, criterion: str, holds: bool, kind: str = "required",
           **extra) -> dict:
    return {"metric": metric, "statistic": statistic, "faulty": faulty, "healthy": healthy,
            "criterion": criterion, "holds": bool(holds), "kind": kind, **extra}


def _all(values, pred) -> bool:
    return bool(values) and all(v is not None and pred(v) for v in values)


def _num(*xs) -> bool:
    return all(_finite(x) for x in xs)


SHARED_SKIP = ("kl_ref", "spike_bundle")


def identical_runs(a: dict, b: dict) -> dict:
    """Exact comparison of two runs: every statistic the histories share (except kl_ref) and the final
    parameters (torch.equal). Returns {'histories': bool, 'parameters': bool, 'first_difference': str|None,
    'compared': number of values compared}."""
    ha, hb = a["history"], b["history"]
    first, compared = None, 0
    if len(ha) != len(hb):
        first = f"lengths differ ({len(ha)} vs {len(hb)} steps)"
    for ra, rb in zip(ha, hb):
        if first:
            break
        for k in sorted((set(ra) & set(rb)) - set(SHARED_SKIP)):
            x, y = ra[k], rb[k]
            compared += 1
            if not (x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)):
                first = f"step {ra['step']}: {k} {x!r} vs {y!r}"
                break
    sa, sb = a["state"], b["state"]
    params = set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    return {"histories": first is None, "parameters": bool(params), "first_difference": first, "compared": compared}


def _delta(history: list, key: str, k: int):
    a, b = end_mean(history, key, k, start=True), end_mean(history, key, k)
    return None if a is None or b is None else b - a


def _check_mask_shift(f, H, runs):
    return [_check("logp_gap", "step 0", at(f, "logp_gap"), at(H, "logp_gap"), "faulty > 0.1 and healthy < 1e-6",
                   _num(at(f, "logp_gap"), at(H, "logp_gap")) and at(f, "logp_gap") > 0.1 and at(H, "logp_gap") < 1e-6,
                   faulty_mean=end_mean(f, "logp_gap", len(f)), healthy_mean=end_mean(H, "logp_gap", len(H)))]


def _check_stale(f, H, runs):
    cf, rmax, rmin = series(f, "clip_frac"), series(f, "ratio_max"), series(f, "ratio_min")
    return [_check("clip_frac", "max over the run", max(cf, default=None), max(series(H, "clip_frac"), default=None),
                   "faulty == 0 on every step", _all(cf, lambda v: v == 0.0)),
            _check("ratio_max - 1", "max over the run", max(rmax) - 1 if rmax else None,
                   max(series(H, "ratio_max")) - 1 if H else None,
                   "faulty == 0 exactly on every step, and ratio_min == 1 exactly",
                   _all(rmax, lambda v: v == 1.0) and _all(rmin, lambda v: v == 1.0),
                   faulty_ratio_min=min(rmin, default=None), healthy_ratio_min=min(series(H, "ratio_min"), default=None))]


def _check_sampler_temp(f, H, runs):
    k = _window(len(f))
    w = f"mean of last {k} steps"
    reads, zadv, gn = (end_mean(f, m, k) for m in ("reads", "zero_adv_frac", "grad_norm"))
    return [_check("ratio_max", "step 0", at(f, "ratio_max"), at(H, "ratio_max"), "faulty > 1.5",
                   _num(at(f, "ratio_max")) and at(f, "ratio_max") > 1.5),
            _check("reads", w, reads, end_mean(H, "reads", k), "reads vanish: faulty < 0.05",
                   _num(reads) and reads < 0.05, "reference", faulty_start=end_mean(f, "reads", k, start=True)),
            _check("zero_adv_frac", w, zadv, end_mean(H, "zero_adv_frac", k), "zero_adv_frac -> 1: faulty >= 0.9",
                   _num(zadv) and zadv >= 0.9, "reference", faulty_start=end_mean(f, "zero_adv_frac", k, start=True)),
            _check("grad_norm", w, gn, end_mean(H, "grad_norm", k), "grad_norm -> 0: faulty < 0.01",
                   _num(gn) and gn < 0.01, "reference", faulty_start=end_mean(f, "grad_norm", k, start=True))]


def _check_sign_flip(f, H, runs):
    k = _window(len(f))
    w = f"mean of last {k} steps"
    r0, r1 = end_mean(f, "reward", k, start=True), end_mean(f, "reward", k)
    t0, t1 = end_mean(f, "turns", k, start=True), end_mean(f, "turns", k)
    return [_check("reward", w, r1, end_mean(H, "reward", k), f"reward falls: last {k} < first {k}",
                   _num(r0, r1) and r1 < r0, "reference", faulty_start=r0),
            _check("turns", w, t1, end_mean(H, "turns", k), f"turns rise: last {k} > first {k}",
                   _num(t0, t1) and t1 > t0, "reference", faulty_start=t0)]


def _check_lr_high(f, H, runs):
    k = _window(len(f))
    w = f"mean of last {k} steps"
    a, b = at(f, "approx_kl"), at(H, "approx_kl")
    m, mh = end_mean(f, "malformed", k), end_mean(H, "malformed", k)
    r = end_mean(f, "reward", k)
    return [_check("approx_kl", "step 0", a, b, "faulty >= 20 x healthy", _num(a, b) and a >= 20 * b,
                   ratio=a / b if _num(a, b) and b > 0 else None),
            _check("malformed", w, m, mh, "malformed calls explode: faulty >= 1 per episode and >= 5 x healthy",
                   _num(m, mh) and m >= 1 and m >= 5 * mh, "reference", faulty_start=end_mean(f, "malformed", k, start=True)),
            _check("reward", w, r, end_mean(H, "reward", k), "reward -> 0: faulty <= 0.05", _num(r) and r <= 0.05,
                   "reference", faulty_start=end_mean(f, "reward", k, start=True))]


def _check_accum_local(f, H, runs):
    gf, gh = end_mean(f, "grad_norm", len(f)), end_mean(H, "grad_norm", len(H))
    gap = max((v for v in series(f, "logp_gap_max") if _finite(v)), default=None)
    ratio = gf / gh if _num(gf, gh) and gh > 0 else None
    return [_check("grad_norm", "mean over the run", gf, gh,
                   "no signature: faulty within 0.5-2 x healthy, and logp_gap_max < 1e-4 on every step",
                   ratio is not None and 0.5 <= ratio <= 2.0 and gap is not None and gap < 1e-4, "reference",
                   ratio=ratio, faulty_logp_gap_max=gap)]


def _check_entropy_sign(f, H, runs):
    e, r = (f[-1]["entropy"], f[-1]["reads"]) if f else (None, None)
    return [_check("entropy", "last step", e, H[-1]["entropy"] if H else None, "faulty < 0.1", _num(e) and e < 0.1,
                   faulty_start=at(f, "entropy")),
            _check("reads", "last step", r, H[-1]["reads"] if H else None, "reads vanish: faulty < 0.05",
                   _num(r) and r < 0.05, "reference", faulty_start=at(f, "reads"))]


def _check_public(f, H, runs):
    n = len(f)
    hc, ev = (f[-1]["hardcode"] if f else None), eval_at(f, n)
    return [_check("hardcode", "last step", hc, H[-1]["hardcode"] if H else None, "faulty >= 0.8",
                   _num(hc) and hc >= 0.8, faulty_start=at(f, "hardcode")),
            _check("held-out hidden pass", f"evaluation after {n} updates", ev, eval_at(runs["healthy"]["history"], n),
                   "faulty <= 0.1", _num(ev) and ev <= 0.1, faulty_start=eval_at(f, 0))]


# "Grows" for a per-step length is read at the resolution of behaviour: one tool call (the shortest call,
# `<call> read </call>`, is 3 policy tokens). A twin whose failed episodes end less than one call longer has not
# grown (a flat but noisy series is above its start half the time, so "<= 0" would be a coin flip).
ONE_CALL_TOKENS = 3.0
LENGTH_CRITERION = (f"faulty grows by >= one call ({ONE_CALL_TOKENS:g} tokens) and more than twin; "
                    "twin < one call")


def length_signature(df, dt) -> bool:
    """The length-bias signature on the failed-episode length changes of the faulty run (df) and its twin (dt)."""
    return _num(df, dt) and df >= ONE_CALL_TOKENS and df > dt and dt < ONE_CALL_TOKENS


def length_across_seeds(rows: list[dict], main: dict | None = None, n_boot: int = 10000, alpha: float = 0.05) -> dict:
    """The length pair read over seeds (the sweep's rows plus, if given, the catalogue's own length_bias result):
    a reference check on the fault's effect beyond its control, the paired difference faulty - twin of the
    failed-episode length changes, whose percentile-bootstrap interval (seeds resampled) should lie above one
    call. Means, medians and intervals of both runs' changes ride along for the report."""
    ok = [(df, dt) for df, dt in _length_pairs(rows, main) if _num(df, dt)]
    n = len(ok)
    stat = f"mean over {n} seeds, {1 - alpha:.0%} CI with seeds resampled"
    crit = f"paired difference faulty - twin: CI above one call ({ONE_CALL_TOKENS:g} tokens)"
    if n < 2:
        return _check("length_fail change across seeds", stat, None, None, crit, False, "reference", seeds=n,
                      detail="needs the pair at two seeds or more (faults.length_extra_seeds >= 1)")
    faulty, twin = [df for df, _ in ok], [dt for _, dt in ok]
    diff, lo, hi = paired_bootstrap_diff(twin, faulty, n_boot=n_boot, alpha=alpha, seed=0)
    (mf, flo, fhi), (mt, tlo, thi) = (bootstrap_ci(v, n_boot=n_boot, alpha=alpha, seed=0) for v in (faulty, twin))
    above = sum(df > dt for df, dt in ok)
    detail = (f"over {n} seeds the faulty run's failed episodes grow by {_signed(mf)} tokens on average "
              f"[{_signed(flo)}, {_signed(fhi)}] (median {_signed(statistics.median(faulty))}, smallest "
              f"{_signed(min(faulty))}), the twin's by {_signed(mt)} [{_signed(tlo)}, {_signed(thi)}] (median "
              f"{_signed(statistics.median(twin))}, largest {_signed(max(twin))}); the difference is "
              f"{_signed(diff)} [{_signed(lo)}, {_signed(hi)}], and the faulty run's grow more at "
              f"{above}/{n} seeds")
    return _check("length_fail change across seeds", stat, mf, mt, crit, lo > ONE_CALL_TOKENS, "reference",
                  seeds=n, diff=diff, diff_lo=lo, diff_hi=hi, faulty_lo=flo, faulty_hi=fhi,
                  faulty_median=statistics.median(faulty), healthy_lo=tlo, healthy_hi=thi,
                  healthy_median=statistics.median(twin), faulty_above_twin=above,
                  detail=detail)


def with_length_across_seeds(checks: dict, rows: list[dict]) -> dict:
    """`checks` with the across-seeds reference check added to length_bias (after its single-seed checks).
    Returns a new dict; `checks` is not changed."""
    if "length_bias" not in checks or not rows:
        return checks
    res = checks["length_bias"]
    new = res["checks"] + [length_across_seeds(rows, res)]
    return {**checks, "length_bias": {**res, "checks": new, "holds": all(c["holds"] for c in new)}}


def _check_length_bias(f, t, runs):
    k = _window(min(len(f), len(t)))
    df, dt = _delta(f, "length_fail", k), _delta(t, "length_fail", k)
    dp, dpt = _delta(f, "length_pass", k), _delta(t, "length_pass", k)
    (fs, fe), (ts, te) = ((end_mean(h, "fail_turn_limit", k, start=True), end_mean(h, "fail_turn_limit", k))
                          for h in (f, t))
    pct = lambda v: f"{v:.0%}" if _finite(v) else "—"  # noqa: E731
    detail = (f"the share of failed episodes that ran out of turns (fail_turn_limit, same steps) went from "
              f"{pct(fs)} to {pct(fe)} in the faulty run and from {pct(ts)} to {pct(te)} in the twin; length_fail "
              f"mixes these long failures with short submitted ones, so it also moves with this share when no "
              f"failed episode gets longer")
    return [_check("length_fail change", f"mean of last {k} minus first {k} steps", df, dt, LENGTH_CRITERION,
                   length_signature(df, dt), detail=detail,
                   faulty_start=end_mean(f, "length_fail", k, start=True), faulty_end=end_mean(f, "length_fail", k),
                   healthy_start=end_mean(t, "length_fail", k, start=True), healthy_end=end_mean(t, "length_fail", k),
                   faulty_turn_limit_start=fs, faulty_turn_limit_end=fe,
                   healthy_turn_limit_start=ts, healthy_turn_limit_end=te),
            _check("length_pass change", f"mean of last {k} minus first {k} steps", dp, dpt,
                   "passed episodes stay short: faulty change < faulty length_fail change",
                   _num(dp, df) and dp < df, "reference",
                   faulty_start=end_mean(f, "length_pass", k, start=True), faulty_end=end_mean(f, "length_pass", k),
                   healthy_start=end_mean(t, "length_pass", k, start=True), healthy_end=end_mean(t, "length_pass", k))]


def _check_ref_is_policy(f, H, runs):
    kl = series(f, "kl_ref")
    twin = runs["kl"]["history"][:len(f)] if "kl" in runs else []
    checks = [_check("kl_ref", "max over the run", max(kl) if _all(kl, _finite) else None,
                     max(series(twin, "kl_ref"), default=None), "faulty == 0 exactly on every step",
                     _all(kl, lambda v: v == 0.0))]
    if runs["healthy"]["config"].get("kl_coef", 0.0) == 0.0:
        same = identical_runs(runs["ref_is_policy"], runs["healthy"])
        detail = same["first_difference"] or f"{same['compared']} statistics equal; parameters equal: {same['parameters']}"
        checks.append(_check("bit-identical to the no-KL run", "every shared statistic and the final parameters",
                             same["histories"] and same["parameters"], True,
                             "histories exactly equal and torch.equal on every parameter",
                             same["histories"] and same["parameters"], detail=detail, compared=same["compared"],
                             parameters_equal=same["parameters"]))
    else:
        checks.append(_check("bit-identical to the no-KL run", "not measured", None, None,
                             "needs a healthy run without KL (rl.kl_coef = 0)", False,
                             detail="the healthy run has rl.kl_coef > 0, so it is not the no-KL run"))
    return checks


CHECKERS = {"mask_shift": _check_mask_shift, "stale_old_logp": _check_stale, "sampler_temp": _check_sampler_temp,
            "sign_flip": _check_sign_flip, "lr_high": _check_lr_high, "accum_local": _check_accum_local,
            "entropy_sign": _check_entropy_sign, "public": _check_public, "length_bias": _check_length_bias,
            "ref_is_policy": _check_ref_is_policy}


def signature_checks(runs: dict) -> dict:
    """Per failure present in `runs` together with its twin (and, except for length_bias, the healthy run):
    {"twin", "checks": [check...], "holds": all checks hold, "required_holds": all required checks hold}."""
    out = {}
    for name in FAILURE_NAMES:
        twin = FAILURES[name].twin
        needed = {name, twin} | ({"healthy"} if name != "length_bias" else set())
        if name == "ref_is_policy":
            needed = {name, "healthy"}  # the bit-identity reference; the kl twin is optional here
        if not needed <= set(runs):
            continue
        f = runs[name]["history"]
        ref = runs["length_twin" if name == "length_bias" else "healthy"]["history"][:len(f)]
        checks = CHECKERS[name](f, ref, runs)
        req = [c["holds"] for c in checks if c["kind"] == "required"]
        out[name] = {"twin": twin, "checks": checks, "holds": all(c["holds"] for c in checks),
                     "required_holds": all(req) if req else None}
    return out


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) < 1e-3 or abs(x) >= 1e4:
            return f"{x:.2e}"
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}g}"
    return str(x)


# ---------------------------------------------------------------- summaries

SUMMARY_KEYS = ("reward", "pass_rate", "reads", "edits", "submitted", "turns", "malformed", "hardcode", "entropy", "approx_kl",
                "clip_frac", "ratio_max", "grad_norm", "zero_adv_frac", "logp_gap", "length_pass", "length_fail",
                "kl_ref")


CONTEXT_KEYS = ("reads", "edits", "submitted", "turns", "malformed", "hardcode", "entropy", "zero_adv_frac",
                "grad_norm")


def summarize(run: dict) -> dict:
    """Per-run summary: steps, wall time, first/last-window means of the main metrics, held-out evaluations."""
    h = run["history"]
    k = _window(len(h))
    pts = eval_points(h)
    keys = [key for key in SUMMARY_KEYS if any(key in r for r in h)]
    return {"steps": run["steps"], "steps_done": len(h), "bug": run["bug"], "seconds": run["seconds"],
            "stopped": run["stopped"], "window": k,
            "first": {key: end_mean(h, key, k, start=True) for key in keys},
            "last": {key: end_mean(h, key, k) for key in keys},
            "step0": {key: at(h, key) for key in keys},
            "heldout": [{"updates": u, "pass_rate": p} for u, p in pts],
            "heldout_start": pts[0][1] if pts else None, "heldout_end": pts[-1][1] if pts else None}


def end_heldout(runs: dict, name: str) -> tuple:
    """(faulty, twin) held-out pass rate at the faulty run's end (the same number of updates)."""
    n = len(runs[name]["history"])
    twin = runs.get(FAILURES[name].twin, {}).get("history", [])
    return eval_at(runs[name]["history"], n), eval_at(twin, n)


def verdict(res: dict) -> str:
    """'yes' (every check holds), 'partly' (some do), 'no'."""
    held = [c["holds"] for c in res["checks"]]
    return "yes" if all(held) else ("partly" if any(held) else "no")


def report_json(runs: dict, checks: dict, fcfg, base_cfg: RLConfig, provenance: dict, eval_tasks: list,
                eval_seed: int, figures: dict, length_sweep: list | None = None) -> dict:
    """Everything reports/faults.json holds (run states excluded)."""
    specs = {r.name: r for r in RUNS}
    return {
        "provenance": provenance,
        "faults_params": {f.name: getattr(fcfg, f.name) for f in fields(fcfg)},
        "base_config": base_cfg.to_dict(),
        "evaluation": {"tasks": [t.name for t in eval_tasks], "per_task": fcfg.eval_per_task,
                       "every": fcfg.eval_every, "seed": eval_seed, "reward": "hidden"},
        "runs": {name: {"bug": run["bug"], "overrides": {k: run["config"][k] for k in specs[name].overrides},
                        "config": run["config"], "steps": run["steps"], "seconds": run["seconds"],
                        "stopped": run["stopped"], "summary": summarize(run), "history": run["history"]}
                 for name, run in runs.items()},
        "failures": {name: {"twin": FAILURES[name].twin, "metrics": list(FAILURES[name].metrics + FAILURES[name].secondary),
                            "what": FAILURES[name].what, "why": FAILURES[name].why, "reference": REFERENCE.get(name),
                            "heldout_end": dict(zip(("faulty", "twin"), end_heldout(runs, name))),
                            "figure": figures.get(name)} for name in checks},
        "signatures": checks,
        "holds": {name: verdict(res) for name, res in checks.items()},
        "required_hold": all(res["required_holds"] is not False for res in checks.values()),
        "total_seconds": sum(r["seconds"] for r in runs.values()),
        "length_seed_sweep": {"rows": length_sweep or [],
                              "summary": length_sweep_summary(length_sweep or [], checks.get("length_bias"))},
    }


def mlflow_metrics(runs: dict, checks: dict) -> tuple[list[dict], dict]:
    """Rows for log_history (every run's dashboard, keys prefixed '<run>.') and flat per-run summary metrics."""
    rows: dict[int, dict] = {}
    for name, run in runs.items():
        for r in run["history"]:
            row = rows.setdefault(r["step"], {"step": r["step"]})
            row.update({f"{name}.{k}": v for k, v in r.items() if k != "step" and _finite(v)})
    summary = {}
    for name, run in runs.items():
        s = summarize(run)
        summary[f"{name}.seconds"] = run["seconds"]
        if s["heldout_end"] is not None:
            summary[f"{name}.heldout_end"] = s["heldout_end"]
        summary.update({f"{name}.last.{k}": v for k, v in s["last"].items() if _finite(v)})
    for name, res in checks.items():
        summary[f"signature.{name}"] = float(res["holds"])
        for i, c in enumerate(res["checks"]):
            for side in ("faulty", "healthy"):
                if _finite(c[side]):
                    summary[f"signature.{name}.{i}.{side}"] = c[side]
    return [rows[s] for s in sorted(rows)], summary


# ---------------------------------------------------------------- the markdown catalogue

REFERENCE = {  # SPEC §6 reference signatures (textbook run, 24 steps), for comparison; not targets
    "mask_shift": "logp_gap ≈ 3.5 nats, grad_norm ≈ 0.5 → 1.5, held-out 0.47 vs 0.70.",
    "stale_old_logp": "clip_frac exactly 0, ratio exactly 1 all run.",
    "sampler_temp": "reads vanish, zero_adv_frac → 1, grad_norm → 0, held-out ≈ 0.15.",
    "sign_flip": "reward falls, turns rise.",
    "lr_high": "approx_kl ≈ 0.31 at step 0, malformed calls explode, reward → 0.",
    "accum_local": "no dashboard signature at all.",
    "entropy_sign": "entropy → 0.03, reads vanish, reward flat ≈ 0.18.",
    "length_bias": "failed episodes grow longer (≈ 21 → 34 policy tokens) while passed ones stay ≈ 13.",
    "public": "train reward → 0.97, hardcode → 0.97, held-out hidden pass → 0.",
    "ref_is_policy": "kl_ref exactly 0, run bit-identical to the no-KL run.",
}


def _value(c: dict, side: str) -> str:
    text = _fmt(c[side])
    if side == "faulty" and c.get("ratio") is not None:
        text += f" (× {_fmt(c['ratio'])})"
    if c.get(f"{side}_lo") is not None:
        text += f" [{_fmt(c[f'{side}_lo'])}, {_fmt(c[f'{side}_hi'])}]"
    start, end = c.get(f"{side}_start"), c.get(f"{side}_end")
    if start is not None and end is not None:
        text += f" ({_fmt(start)} → {_fmt(end)})"
    elif side == "faulty" and start is not None:
        text += f" (from {_fmt(start)})"
    return text


def signature_table(runs: dict, checks: dict) -> list[str]:
    """One row per signature check (plain markdown, no HTML); a failure's name and held-out numbers head its
    first row."""
    lines = ["| failure | exposing metric | faulty value | healthy value | held-out at end faulty vs healthy | "
             "signature holds? |", "|---|---|---|---|---|---|"]
    for name in FAILURE_NAMES:
        if name not in checks:
            continue
        res = checks[name]
        ef, eh = end_heldout(runs, name)
        held = f"{_fmt(ef)} vs {_fmt(eh)} (`{res['twin']}`, after {len(runs[name]['history'])} updates)"
        v = verdict(res)
        for i, c in enumerate(res["checks"]):
            mark = "yes" if c["holds"] else "**no**"
            head = f"[{name}](#{name})" if i == 0 else ""
            overall = f" (overall: {'**' + v + '**' if v != 'yes' else v})" if i == 0 else ""
            lines.append(f"| {head} | {c['metric']} ({c['statistic']}) | {_value(c, 'faulty')} | "
                         f"{_value(c, 'healthy')} | {held if i == 0 else ''} | {mark}{overall} |")
    return lines


def render_markdown(runs: dict, checks: dict, fcfg, provenance: dict, eval_tasks: list, figures: dict,
                    notes: dict | None = None, length_sweep: dict | None = None) -> str:
    """reports/faults.md: the signature table, then one section per failure (fault, signature, measured numbers,
    figure via a relative link from `figures`), then the runs. `notes`: optional extra text per failure;
    `length_sweep`: length_sweep_summary() of the length pair at further seeds, stated under the table."""
    notes = notes or {}
    req_bad = [n for n, r in checks.items() if r["required_holds"] is False]
    ref_bad = [n for n, r in checks.items() if not r["holds"] and n not in req_bad]
    total = sum(r["seconds"] for r in runs.values())
    L = ["# Fault catalogue", "",
         "Every failure of the debugging chapter (SPEC §6), trained from the same RL base and with the same seed as "
         "a healthy twin, with the dashboard metric that exposes it. Generated by `python -m stages.faults` "
         f"(fingerprint `{provenance.get('fingerprint')}`, MLflow run `{provenance.get('mlflow_run_id')}`, "
         f"{provenance.get('threads')} threads); every number is in `reports/faults.json`.", "",
         "Runs: " + ", ".join(f"`{n}` ({r['steps']} steps)" for n, r in runs.items()) + ". "
         f"Held-out evaluation at step 0, every {fcfg.eval_every} steps and at the end, on the {len(eval_tasks)} "
         f"held-out tasks × {fcfg.eval_per_task} episodes with the hidden-test reward, from one evaluation seed "
         f"shared by all runs (common random numbers). Training and evaluation took {total:.0f} s of wall-clock time "
         "(per run in the last table; times depend on other load on the machine, the numbers do not).", "",
         "How to read it: *required* checks are the signatures the catalogue must show (also asserted by "
         "`tests/test_faults.py` on shortened runs); *reference* checks compare with the mechanism SPEC §6 reports "
         "for the textbook run and are reported whichever way they come out. \"Healthy\" values are the twin's over "
         "the same steps as the faulty run. In the figures the top row is the train reward per step (line) and the "
         "held-out hidden-test pass rate (points, at the number of updates done) for the faulty run (left) and its "
         "twin (right); the bottom row is the exposing metric on the same y-limits across the pair.", "",
         "## Signature table", ""]
    L += signature_table(runs, checks)
    L += [""]
    L.append(f"Required signatures: {sum(r['required_holds'] is not False for r in checks.values())}/{len(checks)} "
             "failures hold" + (f"; **not reproduced: {', '.join(req_bad)}**" if req_bad else "") + ". "
             + (f"Reference mechanisms not (fully) reproduced: **{', '.join(ref_bad)}** (see their sections)."
                if ref_bad else "Every reference mechanism reproduced."))
    if length_sweep and length_sweep.get("seeds", 0) > 1:
        n = length_sweep["seeds"]
        L.append(f"Seed dependence: the length_bias signature holds at {length_sweep['holds']}/{n} seeds (the "
                 f"faulty run's failed episodes grow more than the twin's at {length_sweep['faulty_above_twin']}/{n}; "
                 f"the twin's stay within one call at {length_sweep['twin_flat']}/{n}); see [its section](#length_bias).")
    L.append("")
    for name in FAILURE_NAMES:
        if name not in checks:
            continue
        fail, res = FAILURES[name], checks[name]
        s = summarize(runs[name])
        twin_h = runs[fail.twin]["history"] if fail.twin in runs else []
        L += [f"## {name}", "", f"**The fault.** {fail.what}", "", f"**The signature.** {fail.why}", ""]
        if name in REFERENCE:
            L += [f"Reference (SPEC §6, textbook run; our numbers differ in detail): {REFERENCE[name]}", ""]
        L += [f"| check | kind | criterion | {name} | {fail.twin} | holds |", "|---|---|---|---|---|---|"]
        for c in res["checks"]:
            L.append(f"| {c['metric']} ({c['statistic']}) | {c['kind']} | {c['criterion']} | {_value(c, 'faulty')} | "
                     f"{_value(c, 'healthy')} | {'yes' if c['holds'] else '**no**'} |")
        for c in res["checks"]:
            if c.get("detail"):
                L += ["", f"{c['metric']}: {c['detail']}."]
        ef, eh = end_heldout(runs, name)
        L += ["", f"Held-out hidden-test pass: `{name}` {_fmt(s['heldout_start'])} → {_fmt(ef)}, `{fail.twin}` "
                  f"{_fmt(eval_at(twin_h, 0))} → {_fmt(eh)} (after {s['steps_done']} updates). Train reward, mean of "
                  f"the first / last {s['window']} steps: `{name}` {_fmt(s['first'].get('reward'))} → "
                  f"{_fmt(s['last'].get('reward'))}, `{fail.twin}` {_fmt(end_mean(twin_h[:s['steps_done']], 'reward', s['window'], start=True))}"
                  f" → {_fmt(end_mean(twin_h[:s['steps_done']], 'reward', s['window']))}.", ""]
        ctx = [k for k in CONTEXT_KEYS if k in s["last"]]
        L += [f"Other dashboard metrics, mean of the last {s['window']} steps, `{name}` vs `{fail.twin}`: "
              + ", ".join(f"{k} {_fmt(s['last'][k])} vs {_fmt(end_mean(twin_h[:s['steps_done']], k, s['window']))}"
                          for k in ctx) + ".", ""]
        if s["stopped"]:
            L += [f"The run stopped early: {s['stopped']}", ""]
        if res["required_holds"] is False:
            L += ["**The required signature did not reproduce with these params**; the values above are what was "
                  "measured.", ""]
        elif not res["holds"]:
            bad = [c["criterion"] for c in res["checks"] if not c["holds"]]
            L += ["**Not reproduced here:** " + "; ".join(bad) + ". The values above are what was measured.", ""]
        if notes.get(name):
            L += [notes[name], ""]
        if name in figures:
            L += [f"![{name} vs {fail.twin}]({figures[name]})", ""]
    L += ["## Runs", "", "| run | bug | config overrides | steps | seconds | train reward first → last | "
          "held-out start → end |", "|---|---|---|---|---|---|---|"]
    specs = {r.name: r for r in RUNS}
    for name, run in runs.items():
        s = summarize(run)
        ov = ", ".join(f"{k}={run['config'][k]}" for k in specs[name].overrides) or "—"
        L.append(f"| {name} | {run['bug'] or '—'} | {ov} | {s['steps_done']} | {run['seconds']:.1f} | "
                 f"{_fmt(s['first'].get('reward'))} → {_fmt(s['last'].get('reward'))} | "
                 f"{_fmt(s['heldout_start'])} → {_fmt(s['heldout_end'])} |")
    return "\n".join(L) + "\n"


def figure_specs(runs: dict) -> list[dict]:
    """Keyword arguments for agentrl.figures.fault_panel (plus 'name'), one per failure present with its twin;
    the twin's history is cut to the faulty run's length so both panels cover the same steps."""
    out = []
    for name in FAILURE_NAMES:
        fail = FAILURES[name]
        if name not in runs or fail.twin not in runs:
            continue
        n = len(runs[name]["history"])
        out.append({"name": name, "twin": fail.twin, "faulty": runs[name]["history"],
                    "healthy": runs[fail.twin]["history"][:n], "metrics": list(fail.metrics),
                    "secondary": list(fail.secondary), "log_metric": fail.log_metric, "hlines": list(fail.hlines)})
    return out
