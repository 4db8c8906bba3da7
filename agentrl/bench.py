"""`python -m agentrl bench`: measured speed of one training step (64 episodes sampled + one update)."""
from __future__ import annotations

import copy
import statistics
import time


def time_steps(model, tok, tasks, cfg, steps: int, threads: int) -> dict:
    """Median seconds of sampling, update and the whole step over `steps` timed steps (after 2 warm-up)."""
    import torch
    from agentrl.rl.rollout import sample_step
    from agentrl.rl.trainer import env_factory_for, make_optimizer, prepare_batch, rl_update
    torch.set_num_threads(threads)
    model = copy.deepcopy(model)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)
    factory = env_factory_for(cfg)
    sample_t, update_t, tokens = [], [], []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        kept, sampled = sample_step(model, factory, tasks, tok, cfg, gen)
        t1 = time.perf_counter()
        rl_update(model, opt, prepare_batch(kept, tok, cfg), cfg)
        t2 = time.perf_counter()
        if i >= 2:
            sample_t.append(t1 - t0)
            update_t.append(t2 - t1)
            tokens.append(sum(len(t.ids) for t in sampled))
    step = [a + b for a, b in zip(sample_t, update_t)]
    episodes = cfg.group_size * cfg.tasks_per_step
    return {"threads": threads, "sample_s": statistics.median(sample_t), "update_s": statistics.median(update_t),
            "step_s": statistics.median(step), "episodes_per_s": episodes / statistics.median(sample_t),
            "tokens_per_step": statistics.median(tokens)}


def run_bench(args, model, source: str, tok) -> int:
    from agentrl.config import RLConfig
    from agentrl.env.tasks import make_tasks
    cfg = RLConfig()
    print(f"bench: TinyAgent {model.num_params():,} parameters ({source}); one step = "
          f"{cfg.group_size * cfg.tasks_per_step} episodes sampled + one update; median of {args.steps} steps")
    for threads in args.threads:
        r = time_steps(model, tok, make_tasks("train"), cfg, args.steps, threads)
        print(f"  threads {threads}: step {r['step_s']:.3f} s  (sampling {r['sample_s']:.3f} s, update "
              f"{r['update_s']:.3f} s)  {r['episodes_per_s']:.0f} sampled episodes/s  "
              f"{r['tokens_per_step']:.0f} tokens/step")
    return 0
