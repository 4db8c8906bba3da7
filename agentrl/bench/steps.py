"""`python -m agentrl bench`: measured speed of one training step (64 episodes sampled + one update) at each
thread count, and the KV-cache sampler against a full-recompute baseline on the same episodes.

Absolute times depend on the machine and on what else it runs; the ratios measured in the same run (sampler
against baseline, 2 threads against 1) mean the same on any machine.
"""
from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

from agentrl.bench import BENCHES


def time_steps(model, tok, tasks, cfg, steps: int, threads: int) -> dict:
    """Median seconds of sampling, update and the whole step over `steps` timed steps (after 2 warm-up)."""
    import torch

    from agentrl.env.gym.spec import GYM
    from agentrl.rl.rollout import sample_step
    from agentrl.rl.trainer import make_optimizer, prepare_batch, rl_update
    torch.set_num_threads(threads)
    model = copy.deepcopy(model)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)
    factory = GYM.make(cfg)
    sample_t, update_t, tokens, sample_c, update_c = [], [], [], [], []
    for i in range(steps + 2):
        t0, c0 = time.perf_counter(), time.process_time()
        kept, sampled = sample_step(model, factory, tasks, tok, cfg, gen)
        t1, c1 = time.perf_counter(), time.process_time()
        rl_update(model, opt, prepare_batch(kept, tok, cfg), cfg)
        t2, c2 = time.perf_counter(), time.process_time()
        if i >= 2:
            sample_t.append(t1 - t0)
            update_t.append(t2 - t1)
            sample_c.append(c1 - c0)    # CPU seconds of all threads: what a busy machine does not inflate
            update_c.append(c2 - c1)
            tokens.append(sum(len(t.ids) for t in sampled))
    step = [a + b for a, b in zip(sample_t, update_t)]
    episodes = cfg.group_size * cfg.tasks_per_step
    return {"threads": threads, "sample_s": statistics.median(sample_t), "update_s": statistics.median(update_t),
            "step_s": statistics.median(step), "episodes_per_s": episodes / statistics.median(sample_t),
            "tokens_per_step": statistics.median(tokens), "sample_cpu_s": statistics.median(sample_c),
            "update_cpu_s": statistics.median(update_c),
            "step_cpu_s": statistics.median(a + b for a, b in zip(sample_c, update_c))}


CLONING_STEPS = 30


def time_cloning(tok, tasks, steps: int) -> float:
    """CPU seconds of a base cloning of `steps` steps at 1 thread (the pipeline's base recipe, shortened)."""
    import dataclasses

    import torch

    from agentrl.core.config import BaseConfig
    from agentrl.starting.tinyagent import make_rl_base
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    c0 = time.process_time()
    make_rl_base(tok, tasks, dataclasses.replace(BaseConfig(), steps=steps, teach_steps=steps // 2), seed=0)
    cpu = time.process_time() - c0
    torch.set_num_threads(threads)
    return cpu


def full_recompute_episodes(model, envs: list, tok, generator, temperature: float = 1.0,
                            max_call_tokens: int = 5) -> list:
    """The baseline sampler: the same turn loop and the same draws as rollout.sample_episodes, but no KV cache:
    every token is one full forward (the backend's plain `logits`) over the whole prefix of every episode still in
    its call."""
    import torch

    from agentrl.model.logprobs import draw
    from agentrl.rl.rollout import OWNER, Trajectory, pad_rows
    fmt = tok
    ids = [fmt.prompt(env) for env in envs]
    owner = [[OWNER["prompt"]] * len(r) for r in ids]
    logp = [[0.0] * len(r) for r in ids]
    end_call = fmt.stop_id
    alive = list(range(len(envs)))
    with torch.inference_mode():
        while alive:
            calls = {r: [] for r in alive}
            in_call = list(alive)
            for _ in range(max_call_tokens):
                if not in_call:
                    break
                lengths = torch.tensor([len(ids[r]) for r in in_call])
                prefixes = pad_rows([ids[r] for r in in_call], fmt.pad_id)
                last = torch.zeros(prefixes.shape, dtype=torch.bool)
                last[torch.arange(len(in_call)), lengths - 1] = True
                token, token_logp = draw(model.logits(prefixes, last) / temperature, generator)
                for r, t, lp in zip(in_call, token.tolist(), token_logp.tolist()):
                    calls[r].append(t)
                    ids[r].append(t)
                    owner[r].append(OWNER["policy"])
                    logp[r].append(lp)
                in_call = [r for r, t in zip(in_call, token.tolist()) if t != end_call]
            going = []
            for r in alive:
                obs = envs[r].step(fmt.action(calls[r]))
                if obs is not None:
                    reply = fmt.reply(obs, closed=bool(calls[r]) and calls[r][-1] == end_call)
                    ids[r] += reply
                    owner[r] += [OWNER["env"]] * len(reply)
                    logp[r] += [0.0] * len(reply)
                    going.append(r)
            alive = going
    return [Trajectory(ids[r], owner[r], logp[r][1:], env.reward, env.record()) for r, env in enumerate(envs)]


def one_step_of_envs(tasks, cfg, factory, seed: int):
    """One step's episodes (tasks and names drawn from a generator seeded `seed`) and that generator."""
    import torch

    from agentrl.rl.rollout import choose_tasks
    gen = torch.Generator().manual_seed(seed)
    return [factory(task, gen) for task in choose_tasks(tasks, cfg.tasks_per_step, gen)
            for _ in range(cfg.group_size)], gen


def compare_samplers(model, tok, tasks, cfg, repeats: int, threads: int) -> dict:
    """The KV-cache sampler and the full-recompute baseline on the same batches: each repeat draws one step's
    tasks and names, then both samplers play copies of those episodes from the same generator state, in
    alternating order. Returns median seconds of each, their ratio, and the share of episodes both played alike."""
    import torch

    from agentrl.env.gym.spec import GYM
    from agentrl.rl.rollout import sample_episodes
    torch.set_num_threads(threads)
    factory = GYM.make(cfg)
    samplers = {"cached": sample_episodes, "full": full_recompute_episodes}
    times = {name: [] for name in samplers}
    alike = []
    for i in range(repeats + 1):
        envs, gen = one_step_of_envs(tasks, cfg, factory, i)
        state = gen.get_state()
        played = {}
        for name in (("cached", "full") if i % 2 else ("full", "cached")):
            gen.set_state(state)
            t0 = time.perf_counter()
            played[name] = samplers[name](model, copy.deepcopy(envs), tok, gen, cfg.temperature,
                                          cfg.max_call_tokens)
            if i:  # the first repeat warms up
                times[name].append(time.perf_counter() - t0)
        alike += [a.ids == b.ids for a, b in zip(played["cached"], played["full"])]
    cached, full = statistics.median(times["cached"]), statistics.median(times["full"])
    return {"threads": threads, "cached_s": cached, "full_s": full, "speedup": full / cached,
            "same_episodes": sum(alike) / len(alike)}


OP_GROUPS = ("fixed kernels", "PyTorch operators")


def op_group(fn: tuple) -> str | None:
    """The group of a cProfile entry (file, line, name): the fixed kernels' C++ calls, PyTorch's, or Python."""
    file, _, name = fn
    if file != "~":
        return None
    if "agentrl_fixed" in name:
        return "fixed kernels"
    if "torch" in name or "Tensor" in name:
        return "PyTorch operators"
    return None


def sampler_op_shares(model, tok, tasks, cfg, threads: int, seed: int = 3) -> dict:
    """cProfile over each sampler on the same batch of episodes: {sampler: {"wall": s, "ops": s in C++ calls,
    group: s}}, where a group's time is the own time of its C++ entry points (the fixed kernels' calls, PyTorch's
    operators); the rest of the wall is Python and the gym."""
    import cProfile
    import pstats

    import torch

    from agentrl.env.gym.spec import GYM
    from agentrl.rl.rollout import sample_episodes
    torch.set_num_threads(threads)
    factory = GYM.make(cfg)
    out = {}
    for name, sampler in (("KV cache", sample_episodes), ("full recompute", full_recompute_episodes)):
        for _ in range(2):   # the first pass warms up; the second is kept
            envs, gen = one_step_of_envs(tasks, cfg, factory, seed)
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            sampler(model, envs, tok, gen, cfg.temperature, cfg.max_call_tokens)
            prof.disable()
            wall = time.perf_counter() - t0
        row = {"wall": wall, **{g: 0.0 for g in OP_GROUPS}}
        for fn, stat in pstats.Stats(prof).stats.items():
            group = op_group(fn)
            if group:
                row[group] += stat[2]   # own time
        row["ops"] = sum(row[g] for g in OP_GROUPS)
        out[name] = row
    return out


def format_op_shares(shares: dict, threads: int) -> str:
    lines = [f"where each sampler's time goes (cProfile, one batch of the same episodes, {threads} thread(s); the "
             "profiler's own overhead inflates the walls)"]
    for name, r in shares.items():
        parts = "  ".join(f"{g} {r[g]:.3f} s ({r[g] / r['wall']:.0%})" for g in OP_GROUPS)
        lines.append(f"  {name:15s} wall {r['wall']:.3f} s: {parts}  Python and the gym {r['wall'] - r['ops']:.3f} s")
    return "\n".join(lines)


def run_bench(args, model, source: str, tok) -> int:
    from agentrl.bench import growth
    from agentrl.core.config import RLConfig
    from agentrl.env.tasks import make_tasks
    model.use_kernels(args.kernels)
    if args.batch:
        print(growth.format_batch_axis(growth.batch_axis(model, tok, make_tasks("train"), args.batch, args.steps,
                                                         max(args.threads))))
        return 0
    if args.profile:
        threads = max(args.threads)
        print(profile_step_and_eval(model, tok, args.steps, threads))
        print(format_op_shares(sampler_op_shares(model, tok, make_tasks("train"), RLConfig(), threads), threads))
        return 0
    cfg = RLConfig()
    tasks = make_tasks("train")
    print(f"bench: TinyAgent {model.num_params():,} parameters ({source}), {args.kernels} kernels; one step = "
          f"{cfg.group_size * cfg.tasks_per_step} episodes sampled + one update; median of {args.steps} steps")
    steps = {}
    if args.json:   # one mode's step times (and a base cloning's CPU seconds at 1 thread), for compare_numerics
        import json
        import os
        for threads in args.threads:
            steps[threads] = time_steps(model, tok, tasks, cfg, args.steps, threads)
        print(json.dumps({"numerics": os.environ.get("AGENTRL_NUMERICS"), "steps": steps,
                          "cloning_cpu_s": time_cloning(tok, tasks, CLONING_STEPS)}))
        return 0
    for threads in args.threads:
        r = steps[threads] = time_steps(model, tok, tasks, cfg, args.steps, threads)
        print(f"  threads {threads}: step {r['step_s']:.3f} s  (sampling {r['sample_s']:.3f} s, update "
              f"{r['update_s']:.3f} s)  {r['episodes_per_s']:.0f} sampled episodes/s  "
              f"{r['tokens_per_step']:.0f} tokens/step")
    if len(steps) > 1:
        lo, hi = min(steps), max(steps)
        print(f"  {hi} threads against {lo}: step time x{steps[hi]['step_s'] / steps[lo]['step_s']:.2f}")
    hi = max(args.threads)
    r = growth.timed_steps(model, tok, tasks, cfg, args.steps)
    flops = growth.flops_of_step(model.cfg, r["lengths"], cfg.minibatches)
    gemm = growth.gemm_rate(hi, model.cfg)
    rate = (flops["sampling"] + flops["update"]) / (r["sample_s"] + r["update_s"]) / 1e9
    print(f"arithmetic: {(flops['sampling'] + flops['update']) / 1e9:.2f} GFLOP of matrix products per step, "
          f"{rate:.1f} GFLOP/s at {hi} thread(s) against {gemm['fixed']:.0f} GFLOP/s for the same run's GEMM "
          f"(x{rate / gemm['fixed']:.2f}; torch.matmul {gemm['torch']:.0f} GFLOP/s)")
    print(growth.format_kernel_sets(growth.kernel_sets(model, tok, tasks, cfg, args.steps, hi), hi))
    print(f"sampler: KV cache against a full recompute of every prefix at every token, on the same "
          f"{cfg.group_size * cfg.tasks_per_step} episodes (median of {args.steps})")
    for threads in args.threads:
        c = compare_samplers(model, tok, tasks, cfg, args.steps, threads)
        print(f"  threads {threads}: KV cache {c['cached_s']:.3f} s, full recompute {c['full_s']:.3f} s: "
              f"{c['speedup']:.1f}x faster  ({c['same_episodes']:.0%} of episodes token-identical)")
    return 0


def profile_step_and_eval(model, tok, steps: int, threads: int, top: int = 14) -> str:
    """cProfile of `steps` training steps (after one warm-up) and of one evaluation pass (16 episodes on each of
    the 10 validation tasks, the `train` stage's checkpoint evaluation). Returns the text: for each, the wall time,
    the share spent inside torch ops (C calls) against Python, and the functions with the most own time."""
    import cProfile
    import io
    import pstats

    import torch

    from agentrl.core.config import RLConfig
    from agentrl.env.gym.spec import GYM
    from agentrl.env.tasks import make_tasks
    from agentrl.eval.evaluation import evaluate
    from agentrl.rl.rollout import sample_step
    from agentrl.rl.trainer import make_optimizer, prepare_batch, rl_update
    torch.set_num_threads(threads)
    cfg, model = RLConfig(), copy.deepcopy(model)
    opt, factory = make_optimizer(model, cfg), GYM.make(cfg)
    gen = torch.Generator().manual_seed(0)

    def step():
        kept, _ = sample_step(model, factory, make_tasks("train"), tok, cfg, gen)
        rl_update(model, opt, prepare_batch(kept, tok, cfg), cfg)

    def evaluation():
        evaluate(model, make_tasks("validation"), tok, 16, 1.0, torch.Generator().manual_seed(1), cfg,
                 env=GYM.make(cfg, evaluation=True))

    step()   # warm-up: first-use costs (optimizer state, lazy imports) are not a step's
    out = []
    for name, fn, reps in ((f"{steps} training steps", step, steps), ("one evaluation pass (160 episodes)",
                                                                        evaluation, 1)):
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(reps):
            fn()
        prof.disable()
        wall = time.perf_counter() - t0
        stats = pstats.Stats(prof)
        own = {f: s[2] for f, s in stats.stats.items()}   # (file, line, name) -> own seconds
        torch_ops = sum(t for (file, _, fname), t in own.items() if file == "~" and
                        ("torch" in fname or "method" in fname or "built-in" in fname))
        out.append(f"{name}: {wall:.3f} s wall at {threads} thread(s); own time in C calls (torch ops and builtins) "
                   f"{torch_ops:.3f} s, in Python functions {sum(own.values()) - torch_ops:.3f} s")
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        lines = buf.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        out += [line.replace(str(Path.cwd()) + "/", "") for line in lines[start:] if line.strip()]
        out.append("")
    return "\n".join(out)


def compare_numerics(args) -> int:
    """Step time under each numerics mode, side by side: each mode runs in its own process (the kernels are chosen
    when torch loads), the modes alternate for `args.numerics_compare` rounds, and the figure is the ratio of the
    medians of the same minute, on this machine."""
    import json
    import os
    import subprocess
    import sys

    from agentrl.core.numerics import cpu_info
    base = [sys.executable, "-m", "agentrl", "bench", "--json", "--steps", str(args.steps), "--threads",
            ",".join(map(str, args.threads))] + (["--model", args.model] if args.model else []) + \
        (["--quick-base"] if args.quick_base else [])
    runs: dict = {"portable": [], "native": []}
    for i in range(args.numerics_compare):
        for mode in (("portable", "native") if i % 2 == 0 else ("native", "portable")):
            out = subprocess.run(base + ["--numerics", mode], capture_output=True, text=True, env=os.environ.copy())
            if out.returncode != 0:
                print(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"bench: {mode} failed",
                      file=sys.stderr)
                return out.returncode
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[mode].append(result["steps"] | {"cloning_cpu_s": result["cloning_cpu_s"]})
    cpu = cpu_info()
    print(f"bench: numerics modes side by side on {cpu['vendor']} {cpu['model']}, {args.numerics_compare} "
          f"alternating rounds of {args.steps} steps per mode and thread count (median of the rounds' medians)")
    keys = ("sample_s", "update_s", "step_s", "sample_cpu_s", "update_cpu_s", "step_cpu_s")
    cloning = {m: statistics.median(r["cloning_cpu_s"] for r in runs[m]) for m in runs}
    for threads in args.threads:
        med = {m: {k: statistics.median(r[str(threads)][k] for r in runs[m]) for k in keys} for m in runs}
        for mode in ("native", "portable"):
            m = med[mode]
            print(f"  threads {threads} {mode:8s}: step {m['step_s']:.3f} s wall, {m['step_cpu_s']:.3f} s CPU "
                  f"(sampling {m['sample_s']:.3f} / {m['sample_cpu_s']:.3f} s, update {m['update_s']:.3f} / "
                  f"{m['update_cpu_s']:.3f} s)")
        r = {k: med["portable"][k] / med["native"][k] for k in keys}
        print(f"  threads {threads} portable / native: step x{r['step_s']:.2f} wall, x{r['step_cpu_s']:.2f} CPU; "
              f"sampling x{r['sample_s']:.2f} / x{r['sample_cpu_s']:.2f}; update x{r['update_s']:.2f} / "
              f"x{r['update_cpu_s']:.2f}")
    print(f"  base cloning ({CLONING_STEPS} steps, 1 thread): native {cloning['native']:.2f} CPU s, portable "
          f"{cloning['portable']:.2f} CPU s: x{cloning['portable'] / cloning['native']:.2f}")
    return 0


@BENCHES.register("tinyagent")
def bench_tinyagent(args, verb) -> int:
    """`python -m agentrl bench` on TinyAgent: --numerics-compare, --profile, or the step and sampler timings."""
    try:
        verb.model_path(args)
    except ValueError as exc:
        return verb.fail(str(exc))
    if args.numerics_compare:
        return compare_numerics(args)
    verb.set_threads(max(args.threads))
    from agentrl.core.config import UserError
    from agentrl.env.gym.tokenizer import build_tokenizer
    from agentrl.env.tasks import make_tasks
    tok = build_tokenizer(make_tasks("all"))
    try:
        model, source = verb.load_model(args, tok)
    except UserError as exc:
        return verb.fail(str(exc) + ("" if args.model or args.quick_base else verb.model_hint))
    return run_bench(args, model, source, tok)
