"""One seeding scheme: every random stream is a named child of `run.seed`.

    stream_seed(seed)                      the root stream: `seed` itself. Training (the rollout generator of
                                           every GRPO run) and the cloning of starting policies draw from it.
    stream_seed(seed, name, *labels)       every other stream: a 48-bit integer hashed from (seed, name, labels),
                                           e.g. stream_seed(0, "validation"), stream_seed(0, "faults-heldout", 8).

Streams never share a generator, so evaluating a checkpoint, bootstrapping an interval or drawing a test batch
never moves the training stream. `generator(seed, name, ...)` is the torch.Generator of a stream; numpy
consumers (agentrl.eval.stats) take the integer from stream_seed.
"""
from __future__ import annotations

import hashlib


def stream_seed(seed: int, *labels) -> int:
    """The seed of the stream `labels` under `seed` (the root stream when no label is given)."""
    if not labels:
        return int(seed)
    digest = hashlib.sha256(repr((seed,) + labels).encode()).digest()
    return int.from_bytes(digest[:6], "big")


def generator(seed: int, *labels):
    """A fresh torch.Generator for the stream `labels` under `seed`."""
    import torch
    return torch.Generator().manual_seed(stream_seed(seed, *labels))
