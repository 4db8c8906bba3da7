"""`python -m agentrl bench` beyond one step size: how a step's cost grows with the batch, what fraction of the
machine's arithmetic rate it achieves, and the kernel sets side by side.

    flops_of_step     the matrix arithmetic of a step, counted from its episodes' lengths: the sampler's pass over
                      every token, the pre-update pass, and each minibatch's forward and backward (2x forward)
    gemm_rate         the same run's GEMM rate: the fixed kernels' mm (and PyTorch's) on a [4096, D] x [D, d_ff]
                      product, the model's own widest shape
    batch_axis        sampling and update seconds at 16, 64, 256 and 1,024 episodes per step, with the log-log
                      slope of each (1.0: cost grows linearly with the batch) and tokens per second per core
    kernel_sets       the step on the fixed kernels against PyTorch's operators (KERNELS["torch"]), alternating

Elementwise work (layer norms, softmax, GELU, Adam) is not counted: the achieved rate is a lower bound of the
arithmetic done.
"""
from __future__ import annotations

import copy
import math
import statistics
import time


def forward_flops(cfg, n: int, logits: int | None = None) -> float:
    """Matrix arithmetic of one packed row of n tokens through TinyAgent (ModelConfig cfg): the blocks' linear
    layers, causal attention (q k^T and the weighted values), and the output layer for `logits` positions (all n
    by default)."""
    d, ff, layers = cfg.d_model, cfg.d_ff, cfg.n_layer
    linear = 2 * n * layers * (d * 3 * d + d * d + d * ff + ff * d)
    attention = layers * 4 * d * n * (n + 1) / 2
    return linear + attention + 2 * (n if logits is None else logits) * d * cfg.vocab_size


def flops_of_step(cfg, lengths: list[int], minibatches: int = 2) -> dict:
    """{'sampling', 'update'}: the sampler computes every token once (logits after each); the update runs the
    pre-update pass over the real tokens, then forward and backward (twice the forward) over each row up to its
    last target."""
    forward = sum(forward_flops(cfg, n) for n in lengths)
    trained = sum(forward_flops(cfg, n - 1) for n in lengths)
    return {"sampling": forward, "update": forward + 3 * trained}


def gemm_rate(threads: int, cfg, repeats: int = 20) -> dict:
    """GFLOP/s of the fixed kernels' mm and of torch.matmul on [4096, d_model] x [d_model, d_ff], best of
    `repeats` (the machine's rate for the model's widest product, in this run)."""
    import torch

    from agentrl.model.kernels.build import load
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4096, cfg.d_model, generator=g), torch.randn(cfg.d_model, cfg.d_ff, generator=g)
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
    out = {}
    for name, fn in (("fixed", lambda: load().mm(a, b)), ("torch", lambda: a @ b)):
        fn()
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        out[name] = flops / best / 1e9
    return out


def timed_steps(model, tok, tasks, cfg, steps: int) -> dict:
    """Median sampling and update seconds over `steps` steps (after one warm-up) of a copy of the model, with the
    episodes' lengths of the last step."""
    import torch

    from agentrl.env.gym.spec import GYM
    from agentrl.rl.rollout import sample_step
    from agentrl.rl.trainer import make_optimizer, prepare_batch, rl_update
    model = copy.deepcopy(model)
    opt, factory, gen = make_optimizer(model, cfg), GYM.make(cfg), torch.Generator().manual_seed(0)
    sample_t, update_t, lengths = [], [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        kept, sampled = sample_step(model, factory, tasks, tok, cfg, gen)
        t1 = time.perf_counter()
        rl_update(model, opt, prepare_batch(kept, tok, cfg), cfg)
        t2 = time.perf_counter()
        if i:
            sample_t.append(t1 - t0)
            update_t.append(t2 - t1)
        lengths = [len(t.ids) for t in kept]
    return {"sample_s": statistics.median(sample_t), "update_s": statistics.median(update_t), "lengths": lengths}


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def batch_axis(model, tok, tasks, sizes: list[int], steps: int, threads: int) -> dict:
    """Sampling and update cost at each number of episodes per step (groups of 8, the default)."""
    import dataclasses

    import torch

    from agentrl.core.config import RLConfig
    torch.set_num_threads(threads)
    base = RLConfig()
    rows = []
    for episodes in sizes:
        cfg = dataclasses.replace(base, tasks_per_step=max(1, episodes // base.group_size))
        r = timed_steps(model, tok, tasks, cfg, steps)
        flops = flops_of_step(model.cfg, r["lengths"], cfg.minibatches)
        tokens = sum(r["lengths"])
        rows.append({"episodes": cfg.tasks_per_step * cfg.group_size, "tokens": tokens, **{k: r[k] for k in
                     ("sample_s", "update_s")}, "step_s": r["sample_s"] + r["update_s"],
                     "gflop": (flops["sampling"] + flops["update"]) / 1e9,
                     "tokens_per_s_per_core": tokens / (r["sample_s"] + r["update_s"]) / threads})
    xs = [r["episodes"] for r in rows]
    return {"threads": threads, "rows": rows, "gemm": gemm_rate(threads, model.cfg),
            "slope": {k: slope(xs, [r[k] for r in rows]) for k in ("sample_s", "update_s", "step_s")}}


def format_batch_axis(result: dict) -> str:
    gemm = result["gemm"]
    lines = [f"bench: cost against the batch at {result['threads']} thread(s) (median of the timed steps); the same "
             f"run's GEMM [4096, d_model] x [d_model, d_ff]: {gemm['fixed']:.0f} GFLOP/s fixed kernels, "
             f"{gemm['torch']:.0f} GFLOP/s torch.matmul",
             "  episodes  tokens  sampling s  update s   step s   GFLOP  GFLOP/s  of GEMM  tokens/s/core"]
    for r in result["rows"]:
        rate = r["gflop"] / r["step_s"]
        lines.append(f"  {r['episodes']:8d} {r['tokens']:7d} {r['sample_s']:11.3f} {r['update_s']:9.3f} "
                     f"{r['step_s']:8.3f} {r['gflop']:7.2f} {rate:8.1f} {rate / gemm['fixed']:8.2f} "
                     f"{r['tokens_per_s_per_core']:14.0f}")
    s = result["slope"]
    lines.append(f"  log-log slope of cost against episodes: sampling {s['sample_s']:.2f}, update {s['update_s']:.2f}, "
                 f"step {s['step_s']:.2f}")
    return "\n".join(lines)


def kernel_sets(model, tok, tasks, cfg, steps: int, threads: int, rounds: int = 3) -> dict:
    """The step on each kernel set, alternating for `rounds` rounds: {name: median sample_s, update_s, step_s}."""
    import torch
    torch.set_num_threads(threads)
    runs = {"fixed": [], "torch": []}
    for i in range(rounds):
        for name in (("fixed", "torch") if i % 2 == 0 else ("torch", "fixed")):
            runs[name].append(timed_steps(copy.deepcopy(model).use_kernels(name), tok, tasks, cfg, steps))
    return {name: {k: statistics.median(r[k] for r in rs) for k in ("sample_s", "update_s")} |
            {"step_s": statistics.median(r["sample_s"] + r["update_s"] for r in rs)} for name, rs in runs.items()}


def format_kernel_sets(result: dict, threads: int) -> str:
    f, t = result["fixed"], result["torch"]
    return (f"kernels: fixed-order against PyTorch's operators (F.linear, scaled_dot_product_attention, F.gelu) on the "
            f"same steps, {threads} thread(s), alternating: step {f['step_s']:.3f} s against {t['step_s']:.3f} s "
            f"(x{f['step_s'] / t['step_s']:.2f}); sampling x{f['sample_s'] / t['sample_s']:.2f}, update "
            f"x{f['update_s'] / t['update_s']:.2f}")
