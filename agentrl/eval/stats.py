"""Evaluation statistics: pass@k, bootstrap intervals over tasks, and seed/task counts for a t-test's power.

Pure functions on plain numbers / numpy arrays; all randomness comes from an explicit seed
(numpy.random.Generator(PCG64(seed))), never from global RNG state.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


# ---------------------------------------------------------------- pass@k

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k).

    Uses the product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms large binomials.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got k={k}")
    if n - c < k:  # every k-subset contains a pass
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_tasks(counts: Sequence[tuple[int, int]], k: int) -> list[float]:
    """pass@k per task; counts holds one (n samples, c passed) pair per task."""
    return [pass_at_k(n, c, k) for n, c in counts]


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks (each task weighs the same)."""
    if len(counts) == 0:
        raise ValueError("counts must hold at least one (n, c) pair")
    return float(np.mean(pass_at_k_tasks(counts, k)))


# ---------------------------------------------------------------- bootstrap over tasks

def _bootstrap_means(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, np.ndarray]:
    """Mean of values [T] and the means of n_boot resamples of its entries with replacement -> (float, [n_boot]).

    Works on deviations from values[0]: summing n copies of x and dividing by n is not always x in floating
    point, so centring makes a constant input come back exactly (its deviations are exactly 0).
    """
    ref = values[0]
    dev = values - ref
    idx = _rng(seed).integers(0, len(values), size=(n_boot, len(values)))
    return float(ref + dev.mean()), ref + dev[idx].mean(axis=1)


def _check_bootstrap_args(values: np.ndarray, n_boot: int, alpha: float) -> None:
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {values.shape}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got n_boot={n_boot}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got alpha={alpha}")


def _percentile_interval(point: float, boot: np.ndarray, alpha: float) -> tuple[float, float, float]:
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return point, float(lo), float(hi)


def bootstrap_ci(per_task_values: Sequence[float], n_boot: int = 10000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): mean of per-task values [T] and its (1 - alpha) percentile-bootstrap interval,
    resampling tasks with replacement. Same seed -> same interval."""
    values = np.asarray(per_task_values, dtype=np.float64)
    _check_bootstrap_args(values, n_boot, alpha)
    return _percentile_interval(*_bootstrap_means(values, n_boot, seed), alpha)


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], n_boot: int = 10000, alpha: float = 0.05,
                          seed: int = 0) -> tuple[float, float, float]:
    """(diff_mean, lo, hi) for mean(b) - mean(a) ("b minus a"), a and b being per-task values [T] on the same
    tasks in the same order. Task indices are resampled jointly (a paired bootstrap), i.e. the per-task
    differences b - a are resampled. Identical inputs give exactly (0, 0, 0); if b - a equals the same
    float d on every task, the result is exactly (d, d, d)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (same tasks), got {a.shape} and {b.shape}")
    diffs = b - a
    _check_bootstrap_args(diffs, n_boot, alpha)
    return _percentile_interval(*_bootstrap_means(diffs, n_boot, seed), alpha)


# ---------------------------------------------------------------- power of t-tests

def t_test_power(nc, df, alpha: float = 0.05):
    """Power of a two-sided t-test at level alpha whose statistic is noncentral t(df, nc):
    P(T > t_crit) + P(T < -t_crit), t_crit = t_{1 - alpha/2}(df). Broadcasts over arrays."""
    from scipy import stats  # here, not at the top: every evaluating stage imports this module, few need scipy
    t_crit = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(t_crit, df, nc) + stats.nct.cdf(-t_crit, df, nc)


def two_sample_power(sd: float, effect: float, n, alpha: float = 0.05):
    """Power of a two-sample t-test with n per arm (equal sizes, common SD sd) to detect a mean difference
    effect: df = 2n - 2, noncentrality effect / (sd * sqrt(2/n))."""
    n = np.asarray(n, dtype=np.float64)
    return t_test_power(effect / (sd * np.sqrt(2.0 / n)), 2 * n - 2, alpha)


def one_sample_power(task_sd: float, effect: float, n, alpha: float = 0.05):
    """Power of a one-sample (paired) t-test on n per-task differences with SD task_sd and mean effect:
    df = n - 1, noncentrality effect * sqrt(n) / task_sd."""
    n = np.asarray(n, dtype=np.float64)
    return t_test_power(effect * np.sqrt(n) / task_sd, n - 1, alpha)


def _check_power_args(sd: float, effect: float, power: float, alpha: float, max_n: int) -> None:
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got sd={sd}")
    if effect == 0:
        raise ValueError("effect must be non-zero (a zero effect is detected with probability alpha at any n)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got alpha={alpha}")
    if not alpha < power < 1:
        raise ValueError(f"power must be in (alpha={alpha}, 1), got power={power}")
    if max_n < 2:
        raise ValueError(f"max_n must be >= 2, got max_n={max_n}")


def _smallest_n(power_of_n: Callable[[np.ndarray], np.ndarray], power: float, max_n: int) -> int:
    """Smallest n in [2, max_n] with power_of_n(n) >= power; evaluates all n at once (cheap: one scipy call)."""
    ns = np.arange(2, max_n + 1)
    hits = np.flatnonzero(power_of_n(ns) >= power)
    if hits.size == 0:
        raise ValueError(f"power {power} is not reached with n <= max_n={max_n}")
    return int(ns[hits[0]])


def seeds_for_power(sd: float, effect: float, power: float = 0.8, alpha: float = 0.05, max_n: int = 10000) -> int:
    """Smallest number of seeds per arm (n >= 2) for which a two-sided two-sample t-test at level alpha
    detects a mean difference effect between arms whose per-seed SD is sd with the given power."""
    _check_power_args(sd, effect, power, alpha, max_n)
    return _smallest_n(lambda n: two_sample_power(sd, effect, n, alpha), power, max_n)


def tasks_for_power(task_sd: float, effect: float, power: float = 0.8, alpha: float = 0.05,
                    max_n: int = 10000) -> int:
    """Smallest number of tasks (n >= 2) for which a two-sided one-sample t-test on per-task differences
    (SD task_sd, mean effect) at level alpha reaches the given power."""
    _check_power_args(task_sd, effect, power, alpha, max_n)
    return _smallest_n(lambda n: one_sample_power(task_sd, effect, n, alpha), power, max_n)


def simulate_power(sd: float, effect: float, n: int, trials: int = 2000, alpha: float = 0.05,
                   seed: int = 0) -> float:
    """Monte Carlo power: share of `trials` experiments, each two arms of n N(0, sd) / N(effect, sd) draws,
    in which scipy.stats.ttest_ind (pooled variance) gives p < alpha. All trials in one vectorised call.

    Each arm has its own stream drawn as [n, trials], so the draws for n are a prefix of those for n + 1
    (common random numbers): a scan over n with one seed gives a smooth power curve.
    """
    if n < 2:
        raise ValueError(f"n must be >= 2, got n={n}")
    seq_a, seq_b = np.random.SeedSequence(seed).spawn(2)
    arm_a = np.random.Generator(np.random.PCG64(seq_a)).standard_normal((n, trials)) * sd
    arm_b = np.random.Generator(np.random.PCG64(seq_b)).standard_normal((n, trials)) * sd + effect
    from scipy import stats
    p = stats.ttest_ind(arm_a, arm_b, axis=0).pvalue
    return float(np.mean(p < alpha))


def simulated_seeds_for_power(sd: float, effect: float, power: float = 0.8, trials: int = 2000, seed: int = 0,
                              max_n: int = 200, *, alpha: float = 0.05, n_min: int = 2) -> int:
    """Smallest n in [n_min, max_n] whose simulated power (simulate_power, same seed for every n) is >= power.
    n_min > 2 skips the scan's start, e.g. to search only near an analytic answer."""
    _check_power_args(sd, effect, power, alpha, max_n)
    for n in range(max(n_min, 2), max_n + 1):
        if simulate_power(sd, effect, n, trials, alpha, seed) >= power:
            return n
    raise ValueError(f"simulated power {power} is not reached with n <= max_n={max_n}")


def power_table(sd: float, effects: Sequence[float] = (0.10, 0.05, 0.02), power: float = 0.8,
                alpha: float = 0.05) -> list[dict]:
    """One row {effect, seeds_per_arm} per effect: seeds per arm needed at per-seed SD sd (seeds_for_power)."""
    return [{"effect": e, "seeds_per_arm": seeds_for_power(sd, e, power, alpha)} for e in effects]


# ---------------------------------------------------------------- a policy's test numbers

def counts_summary(counts: dict, ks: Sequence[int], n_boot: int, alpha: float, seed: int) -> dict:
    """counts {task: (n, c)} -> pass@1 with its task-bootstrap interval, pass@k for every k, per-task numbers."""
    rates = [c / n for n, c in counts.values()]
    _, lo, hi = bootstrap_ci(rates, n_boot, alpha, seed=seed)
    return {"pass_at_1": mean_pass_at_k(list(counts.values()), 1), "ci_lo": lo, "ci_hi": hi,
            "pass_at_k": {str(k): mean_pass_at_k(list(counts.values()), k) for k in ks},
            "per_task": {name: {"n": n, "c": c, **{f"pass_at_{k}": pass_at_k(n, c, k) for k in ks}}
                         for name, (n, c) in counts.items()}}
