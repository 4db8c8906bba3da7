"""`bench --backend hf`'s memory: the peak resident set of one update's forward and backward (the LM head on policy
positions, or full [B, T, vocab] logits) above the resident set before the update. agentrl.bench.hf runs each variant
in a fresh process of its own, which keeps freed memory as a lab process does (agentrl.labs.allocator)."""
from __future__ import annotations

import resource
import time
from pathlib import Path


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_kib() -> int:
    """The resident set now (KiB), after resetting the process's peak to it (Linux: /proc/self/clear_refs "5"),
    so that peak_kib() measures from here rather than from the model's load. Without /proc: the lifetime peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        now = _status_kib("VmRSS")
        if now is not None:
            return now
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_kib() -> int:
    """The resident set's peak (KiB) since reset_peak_kib()."""
    hwm = _status_kib("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def update_memory(model, chat, variant: str, rows: int) -> dict:
    """Peak resident set of one forward and backward of the token-mean policy loss on `rows` expert demonstrations,
    above the resident set before it: the LM head on policy positions ("policy") or full logits ("full")."""
    import torch

    from agentrl.env.gym.environment import make_env_factory
    from agentrl.env.tasks import make_tasks
    from agentrl.model.logprobs import selected_log_probs
    from agentrl.rl.rollout import collate
    from agentrl.starting.chat import expert_demo
    tasks, factory, gen = make_tasks("train"), make_env_factory(6, "hidden", True), torch.Generator().manual_seed(0)
    batch = collate([expert_demo(factory(tasks[i % len(tasks)], gen), chat) for i in range(rows)], chat.pad_id)
    ids, mask = batch["ids"], batch["action_mask"]
    before = reset_peak_kib()   # loading a model can peak above what its update needs: the peak starts here
    t0 = time.perf_counter()
    if variant == "policy":
        logp, _ = model.log_probs(ids, mask > 0)
    else:
        logits = model.lm(input_ids=ids).logits[:, :-1]     # [B, T-1, vocab]
        logp = selected_log_probs(logits, ids[:, 1:])
    loss = -(logp * mask).sum() / mask.sum()
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = peak_kib()
    return {"variant": variant, "rows": rows, "width": int(ids.shape[1]), "policy_tokens": int(mask.sum()),
            "peak_above_mib": (peak - before) / 1024, "peak_mib": peak / 1024, "seconds": seconds}
