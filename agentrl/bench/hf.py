"""`python -m agentrl bench --backend hf [--model DIR]`: the Hugging Face backend's sampler and update, measured side
by side.

- Sampling: the rollout's own token loop (agentrl.rl.rollout._sample_calls on the backend's KV-cached sampler)
  against plain `transformers` `generate` (temperature 1, top-k and top-p off) on the same prompts, each asked for
  exactly the same number of new tokens; alternating order, median seconds per new token.
  The backend computes the prompts' shared prefix (the system prompt with the tools) once per batch.
- Update: one forward and backward with the LM head on policy positions, its achieved GFLOP/s (agentrl's count of
  the decoder's operations) over a same-run float32 GEMM of the model's shapes.
- Floors: each phase (a decode step at each row count, the update's pass, the cold start's cloning step with Adam)
  beside its floor, the larger of its bytes at a same-run read bandwidth and its FLOPs at the same-run GEMM
  (agentrl.model.floors).
- Memory (measured by agentrl.bench.hf_memory): one update's forward and backward on the same demonstrations with
  the LM head on policy positions only (the backend's `log_probs`) against full [B, T, vocab] logits; each variant in
  a fresh process, its peak resident set above the resident set it had before the update.
- The process keeps freed memory as a lab process does (agentrl.labs.allocator): its times are the lab's.

The model is a small random-init Qwen3 made from the seed (speed and memory do not depend on what it has learned),
or a user's model directory (--model: Qwen3 or Llama). Absolute figures depend on the machine; the ratios are the
result.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.bench import BENCHES
from agentrl.bench.caps import run_caps_bench
from agentrl.bench.hf_memory import update_memory
from agentrl.model.floors import gemm_gflops, memory_bandwidth_gbs

TOKENIZER_DIR = Path("data/tokenizers/qwen3")


def small_or_given(model_dir: str | None, hidden: int, layers: int):
    """(model, chat) for the bench: the user's model directory, or a small random-init Qwen3 made from seed 0."""
    from agentrl.backends.hf import load_model, load_tokenizer, make_small_model
    from agentrl.core.seeding import generator
    from agentrl.env.gym.chat import GymToolChat
    if model_dir:
        return load_model(model_dir, "--model"), GymToolChat(load_tokenizer(model_dir, "--model"))
    path = Path(tempfile.mkdtemp(prefix="agentrl-bench-hf-"))
    model = make_small_model(path, generator(0, "bench", "init"), TOKENIZER_DIR, hidden=hidden, layers=layers,
                             field="--model")
    return model, GymToolChat(load_tokenizer(path))


def prompts(chat, rows: int) -> list[list[int]]:
    """The menu lab's first prompts (Qwen3's template with the gym's tools) of `rows` episodes."""
    import torch

    from agentrl.env.gym.environment import make_env_factory
    from agentrl.env.tasks import make_tasks
    tasks, factory, gen = make_tasks("train"), make_env_factory(6, "hidden", True), torch.Generator().manual_seed(0)
    return [chat.prompt(factory(tasks[i % len(tasks)], gen)) for i in range(rows)]


def backend_sample(model, chat, batch: list[list[int]], new_tokens: int, seed: int) -> float:
    """Seconds for the rollout's token loop to draw `new_tokens` tokens in every row (no stop token)."""
    import torch

    from agentrl.rl.rollout import _sample_calls
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        t0 = time.perf_counter()
        sampler = model.sampler(chat.pad_id)
        calls, _, _ = _sample_calls(sampler, sampler.append(batch), gen, 1.0, new_tokens, -1, chat.pad_id)
        seconds = time.perf_counter() - t0
    assert all(len(c) == new_tokens for c in calls)
    return seconds


def plain_generate(model, chat, batch: list[list[int]], new_tokens: int, seed: int) -> float:
    """Seconds for `model.lm.generate` on the same prompts, left-padded, sampling at temperature 1 with top-k and
    top-p off, exactly `new_tokens` new tokens per row."""
    import torch
    width = max(map(len, batch))
    ids = torch.tensor([[chat.pad_id] * (width - len(r)) + r for r in batch])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in batch])
    torch.manual_seed(seed)   # generate draws from the global generator
    with torch.inference_mode(), model.compute():
        t0 = time.perf_counter()
        out = model.lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                pad_token_id=chat.pad_id)
        seconds = time.perf_counter() - t0
    assert out.shape[1] == width + new_tokens
    return seconds


def compare_sampling(model, chat, rows: int, new_tokens: int, repeats: int) -> dict:
    batch = prompts(chat, rows)
    runs = {"backend": backend_sample, "generate": plain_generate}
    times: dict = {name: [] for name in runs}
    for i in range(repeats + 1):
        for name in (("backend", "generate") if i % 2 else ("generate", "backend")):
            s = runs[name](model, chat, batch, new_tokens, i)
            if i:   # the first round warms up
                times[name].append(s / new_tokens)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"rows": rows, "prompt_tokens": statistics.median(map(len, batch)), "new_tokens": new_tokens,
            "backend_s_per_token": med["backend"], "generate_s_per_token": med["generate"],
            "speedup": med["generate"] / med["backend"]}


def update_flops(config, rows: int, width: int, policy_tokens: int) -> float:
    """Floating-point operations of one forward and backward (backward = 2 x forward) of a decoder over rows x width
    tokens with the LM head at policy_tokens positions: 2 per weight per token in the projections and MLP, the
    attention scores and mixing (2 x 2 x width^2 x heads x head_dim per row and layer, causal: half), the LM head."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    per_layer = h * heads * head_dim * 2 + h * kv * head_dim * 2 + 3 * h * config.intermediate_size
    tokens = rows * width
    forward = 2 * per_layer * layers * tokens + layers * rows * 2 * width * width * heads * head_dim
    forward += 2 * config.vocab_size * h * policy_tokens
    return 3.0 * forward


def update_throughput(model, chat, rows: int, repeats: int = 3) -> dict:
    """One update's forward and backward (LM head on policy positions) on `rows` expert demonstrations, median
    seconds, its achieved GFLOP/s, and a same-run GEMM of the model's shapes (tokens x hidden @ hidden x
    intermediate) for the ratio."""
    import torch

    from agentrl.env.gym.environment import make_env_factory
    from agentrl.env.tasks import make_tasks
    from agentrl.rl.rollout import collate
    from agentrl.starting.chat import expert_demo
    tasks, factory, gen = make_tasks("train"), make_env_factory(6, "hidden", True), torch.Generator().manual_seed(0)
    batch = collate([expert_demo(factory(tasks[i % len(tasks)], gen), chat) for i in range(rows)], chat.pad_id)
    ids, mask = batch["ids"], batch["action_mask"]
    times = []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logp, _ = model.log_probs(ids, mask > 0)
        (-(logp * mask).sum() / mask.sum()).backward()
        if i:
            times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    config = model.lm.config
    flops = update_flops(config, rows, int(ids.shape[1]), int(mask.sum()))
    from agentrl.backends.hf import PRECISIONS
    gemm = gemm_gflops(ids.numel(), config.hidden_size, config.intermediate_size, dtype=PRECISIONS[model.precision])
    achieved = flops / seconds / 1e9
    return {"rows": rows, "width": int(ids.shape[1]), "policy_tokens": int(mask.sum()), "seconds": seconds,
            "gflop": flops / 1e9, "achieved_gflops": achieved, "gemm_gflops": gemm, "ratio": achieved / gemm}


def child_memory(variant: str, model_dir: str | None, hidden: int, layers: int, rows: int, threads: int,
                 dtype: str = "fp32") -> dict:
    """update_memory in a fresh process (each variant's peak measured alone)."""
    cmd = [sys.executable, "-m", "agentrl.bench.hf", variant, str(hidden), str(layers), str(rows),
           str(threads), dtype, model_dir or ""]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"bench memory child ({variant}) failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_scan(model, chat, rows: int, new_tokens: int, seed: int = 0, prefix_kv: str = "repeat") -> dict:
    """The sampler's decode alone (after the prompts' prefill), its shared prefix kept as `prefix_kv` says: seconds
    per new token at `rows` rows, and the sampler-trainer gap of the tokens it drew (mean and max |trainer - sampler|
    log-prob)."""
    import torch

    from agentrl.model.packing import pad_rows
    from agentrl.rl.rollout import _sample_calls
    batch = prompts(chat, rows)
    gen = torch.Generator().manual_seed(seed)
    model.prefix_kv = prefix_kv
    with torch.inference_mode():
        sampler = model.sampler(chat.pad_id)
        first = sampler.append(batch)
        t0 = time.perf_counter()
        calls, logps, _ = _sample_calls(sampler, first, gen, 1.0, new_tokens, -1, chat.pad_id)
        seconds = (time.perf_counter() - t0) / new_tokens
        ids = pad_rows([b + c for b, c in zip(batch, calls)], chat.pad_id)
        at = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
        for r, b in enumerate(batch):
            at[r, len(b) - 1:len(b) - 1 + len(calls[r])] = True
        trainer = model.log_probs(ids, at)[0][at]
    model.prefix_kv = "repeat"
    gap = (trainer - torch.tensor([x for row in logps for x in row])).abs()
    return {"rows": rows, "new_tokens": new_tokens, "s_per_token": seconds, "gap_mean": float(gap.mean()),
            "gap_max": float(gap.max()), "prefix_kv": prefix_kv,
            "shared": sampler.prefix_tokens if sampler.prefix_apart else 0,
            "prompt_tokens": statistics.median(map(len, batch))}


def sampler_weight_bytes(model) -> int:
    """Bytes the decoder reads per decode step: every linear layer's sampler copy (the LM head included)."""
    model.sampler_weights.refresh()
    return sum(w.numel() * w.element_size() for w in model.sampler_weights.copies)


def cloning_step(model, chat, rows: int, repeats: int = 3) -> dict:
    """The cold start's step as the lab runs it (agentrl.starting.chat.clone: `rows` expert conversations, forward,
    backward, Adam), median seconds after a warm-up step; the model's weights are put back afterwards."""
    import torch

    from agentrl.env.gym.environment import make_env_factory
    from agentrl.env.tasks import make_tasks
    from agentrl.rl.rollout import collate
    from agentrl.starting.chat import clone, expert_demo
    tasks, factory, gen = make_tasks("train"), make_env_factory(6, "hidden", True), torch.Generator().manual_seed(0)
    demos = [expert_demo(factory(tasks[i % len(tasks)], gen), chat) for i in range(rows)]
    batch = collate(demos, chat.pad_id)
    saved = {k: v.clone() for k, v in model.lm.state_dict().items()}
    stamps = [time.perf_counter()]
    clone(model, demos, chat, repeats + 1, 1e-6, None, gen, on_step=lambda *_: stamps.append(time.perf_counter()))
    with torch.no_grad():
        model.lm.load_state_dict(saved)
    model.eval()
    steps = [b - a for a, b in zip(stamps, stamps[1:])][1:]
    return {"rows": rows, "width": int(batch["ids"].shape[1]), "policy_tokens": int(batch["action_mask"].sum()),
            "seconds": statistics.median(steps)}


def decode_floors(model, dtype: str, scan: list, gemm: float, bandwidth: float) -> list[dict]:
    """Each decode step's measured seconds beside its floor (agentrl.model.floors): the KV cache at the prompt plus
    half the new tokens, a prefix kept once (prefix_kv `once`) counted once."""
    from agentrl.model import floors
    shapes = floors.shapes_of(model.lm.config, model.num_params())
    rows = []
    for d in scan:
        context = int(d["prompt_tokens"] + d["new_tokens"] / 2)
        kept = "" if d["prefix_kv"] == "repeat" else f", prefix of {d['shared']} kept once"
        rows.append({"phase": f"decode step, {d['rows']} rows{kept}", "seconds": d["s_per_token"], "context": context,
                     **floors.floor(*floors.decode_step(shapes, d["rows"], context, dtype, d["shared"]), gemm,
                                    bandwidth)})
        rows[-1]["ratio"] = rows[-1]["seconds"] / rows[-1]["floor_s"]
    return rows


def phase_floors(model, dtype: str, scan: list, sampling: dict, update: dict, cloning: dict,
                 bandwidth: float) -> list[dict]:
    """Each phase's measured seconds beside its floor (agentrl.model.floors): decode steps at each row count (the
    KV cache at the prompt plus half the new tokens), the update's forward and backward, a cloning step."""
    from agentrl.model import floors
    shapes = floors.shapes_of(model.lm.config, model.num_params())
    gemm = update["gemm_gflops"]
    rows = decode_floors(model, dtype, scan, gemm, bandwidth)
    rows.append({"phase": f"update pass, {update['rows']} x {update['width']} tokens", "seconds": update["seconds"],
                 **floors.floor(*floors.training_pass(shapes, update["rows"], update["width"],
                                                      update["policy_tokens"], dtype), gemm, bandwidth)})
    pass_flops, pass_bytes = floors.training_pass(shapes, cloning["rows"], cloning["width"],
                                                  cloning["policy_tokens"], dtype)
    rows.append({"phase": f"cloning step, {cloning['rows']} x {cloning['width']} tokens + Adam",
                 "seconds": cloning["seconds"],
                 **floors.floor(pass_flops, pass_bytes + floors.adam_step(shapes)[1], gemm, bandwidth)})
    for r in rows:
        r["ratio"] = r["seconds"] / r["floor_s"]
        r.setdefault("context", None)
    return rows


def floor_table(dtype: str, rows: list[dict], gemm: float, bandwidth: float) -> list[str]:
    out = [f"  [{dtype}] each phase against its floor: max(bytes / {bandwidth:.1f} GB/s read, FLOPs / {gemm:.1f} "
           f"GFLOP/s {dtype} GEMM of the model's shapes), both measured in this run",
           "  | phase | time (ms) | floor (ms) | bound by | GFLOP | GB | time / floor |",
           "  |---|---|---|---|---|---|---|"]
    out += [f"  | {r['phase']} | {1000 * r['seconds']:.1f} | {1000 * r['floor_s']:.1f} | {r['bound']} | "
            f"{r['gflop']:.2f} | {r['gbytes']:.3f} | x{r['ratio']:.1f} |" for r in rows]
    return out


def bench_dtype(args, model, chat, dtype: str, bandwidth: float, threads: int, hidden: int, layers: int) -> dict:
    """One dtype's row of the bench: sampler against generate, decode against rows, the gap, the update's
    throughput against a same-run GEMM, a cloning step, each phase against its floor, the update's memory."""
    model.set_precision(dtype)
    rows = sorted(args.rows)
    weights_floor_s = sampler_weight_bytes(model) / (bandwidth * 1e9)
    if args.decode_only:
        return decode_only(args, model, chat, dtype, bandwidth, rows, weights_floor_s)
    s = compare_sampling(model, chat, rows[0], args.new_tokens, args.steps)
    scan = [decode_scan(model, chat, r, args.new_tokens, prefix_kv=mode) for r in rows for mode in args.prefix_kv]
    u = update_throughput(model, chat, args.memory_rows, max(args.steps, 1))
    c = cloning_step(model, chat, args.clone_rows, max(min(args.steps, 3), 1))
    floors_ = phase_floors(model, dtype, scan, s, u, c, bandwidth)
    print(f"  [{dtype}] sampling {s['rows']} prompts of ~{s['prompt_tokens']:.0f} tokens, {s['new_tokens']} new "
          f"tokens each (median of {args.steps}): backend sampler {1000 * s['backend_s_per_token']:.1f} ms per new "
          f"token, plain generate {1000 * s['generate_s_per_token']:.1f} ms: x{s['speedup']:.2f}")
    print_scan(dtype, scan, weights_floor_s)
    tokens_s = u["rows"] * u["width"] / u["seconds"]
    print(f"  [{dtype}] update, {u['rows']} rows of {u['width']} tokens ({u['policy_tokens']} policy tokens), forward "
          f"+ backward: {u['seconds']:.2f} s ({tokens_s:.0f} tokens/s), {u['achieved_gflops']:.1f} GFLOP/s against a "
          f"same-run {dtype} GEMM of the model's shapes at {u['gemm_gflops']:.1f} GFLOP/s: x{u['ratio']:.2f}")
    print("\n".join(floor_table(dtype, floors_, u["gemm_gflops"], bandwidth)))
    mem = {v: child_memory(v, args.model, hidden, layers, args.memory_rows, threads, dtype) for v in ("policy", "full")}
    p, f = mem["policy"], mem["full"]
    print(f"  [{dtype}] update memory, {p['rows']} rows of {p['width']} tokens, peak resident set above the start: "
          f"LM head on policy positions {p['peak_above_mib']:.0f} MiB, full logits {f['peak_above_mib']:.0f} MiB: "
          f"x{f['peak_above_mib'] / max(p['peak_above_mib'], 1):.1f}")
    return {"sampling": s, "decode": scan, "floor_s_per_token": weights_floor_s,
            "update": {**u, "tokens_per_s": tokens_s}, "cloning": c, "floors": floors_, "memory": mem}


def print_scan(dtype: str, scan: list, weights_floor_s: float) -> None:
    for d in scan:
        print(f"  [{dtype}] decode at {d['rows']:4d} rows, prefix {d['prefix_kv']}: {1000 * d['s_per_token']:.1f} ms "
              f"per new token (the weights read once: {1000 * weights_floor_s:.1f} ms); sampler-trainer gap mean "
              f"{d['gap_mean']:.2e}, max {d['gap_max']:.2e} nats")


def decode_only(args, model, chat, dtype: str, bandwidth: float, rows: list, weights_floor_s: float) -> dict:
    """--decode-only: the decode scan at each row count, each prefix_kv mode in turn, repeated args.steps times
    alternating the modes (the median kept), and each against its floor at a same-run GEMM of the model's shapes
    ([4096, hidden] x [hidden, intermediate], about an update's tokens)."""
    from agentrl.backends.hf import PRECISIONS
    config = model.lm.config
    gemm = gemm_gflops(4096, config.hidden_size, config.intermediate_size, dtype=PRECISIONS[dtype])
    runs = {(r, m): [] for r in rows for m in args.prefix_kv}
    for _ in range(max(args.steps, 1)):
        for r in rows:
            for mode in args.prefix_kv:
                runs[(r, mode)].append(decode_scan(model, chat, r, args.new_tokens, prefix_kv=mode))
    scan = []
    for got in runs.values():
        median = statistics.median(d["s_per_token"] for d in got)
        scan.append({**got[0], "s_per_token": median, "repeats": [d["s_per_token"] for d in got]})
    print_scan(dtype, scan, weights_floor_s)
    table = decode_floors(model, dtype, scan, gemm, bandwidth)
    print("\n".join(floor_table(dtype, table, gemm, bandwidth)))
    return {"decode": scan, "floor_s_per_token": weights_floor_s, "gemm_gflops": gemm, "floors": table}


def run_hf_bench(args, hidden: int = 64, layers: int = 2) -> int:
    if args.isa_caps:
        return run_caps_bench(args)
    import torch

    from agentrl.core.config import ConfigError
    from agentrl.core.numerics import cpu_info
    from agentrl.labs.allocator import keep_freed_memory
    from agentrl.labs.precision import BF16_FLAGS, check_dtype, onednn_cap
    threads = max(args.threads)
    torch.set_num_threads(threads)
    kept = keep_freed_memory()   # as a lab process does: its timings are the lab's
    cpu = cpu_info()
    refused = {}
    for dtype in args.dtype:
        try:
            check_dtype(dtype, "cpu", "--dtype")
        except ConfigError as exc:
            refused[dtype] = str(exc)
    if len(refused) == len(args.dtype):
        raise ConfigError(next(iter(refused.values())))
    model, chat = small_or_given(args.model, hidden, layers)
    model.eval()
    bandwidth = memory_bandwidth_gbs()
    print(f"bench hf: {model.num_params():,} parameters ({args.model or 'small random-init Qwen3'}), "
          f"{threads} thread(s), {cpu['vendor']} {cpu['model']}, bf16 flags: "
          f"{', '.join(sorted(BF16_FLAGS & cpu['flags'])) or 'none'}, oneDNN capped at {onednn_cap() or 'nothing'}; "
          f"freed memory {'kept, as in a lab' if kept else 'returned (not glibc)'}; "
          f"same-run read bandwidth {bandwidth:.1f} GB/s")
    out = {"threads": threads, "bandwidth_gbs": bandwidth, "refused": refused, "keeps_freed_memory": kept,
           "cpu": {"vendor": cpu["vendor"], "model": cpu["model"], "bf16_flags": sorted(BF16_FLAGS & cpu["flags"]),
                   "onednn_cap": onednn_cap()}}
    for dtype in args.dtype:
        if dtype in refused:
            print(f"  [{dtype}] refused: {refused[dtype]}")
            continue
        out[dtype] = bench_dtype(args, model, chat, dtype, bandwidth, threads, hidden, layers)
    if args.json:
        first = out[next(d for d in args.dtype if d not in refused)]
        headline = {key: first[key] for key in ("sampling", "update", "memory") if key in first}
        print(json.dumps({**out, **headline}))
    return 0


if __name__ == "__main__":   # the memory child: variant hidden layers rows threads dtype [model_dir]
    import os

    from agentrl.core import numerics
    numerics.pin(os.environ.get("AGENTRL_NUMERICS", "portable"))   # the parent's mode (its pin exported it)
    import torch

    from agentrl.labs.allocator import keep_freed_memory
    keep_freed_memory()
    variant, hidden, layers, rows, threads = sys.argv[1], *map(int, sys.argv[2:6])
    torch.set_num_threads(threads)
    model, chat = small_or_given(sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] else None, hidden, layers)
    model.set_precision(sys.argv[6])
    print(json.dumps(update_memory(model, chat, variant, rows)))

@BENCHES.register("hf")
def bench_hf(args, verb) -> int:
    verb.set_threads(max(args.threads))
    return run_hf_bench(args)
