"""`python -m agentrl bench --backend NAME`: each backend's bench, registered by name (BENCHES) -- TinyAgent's
training step and sampler and the numerics modes side by side (steps), a Hugging Face backend's sampler against
plain generate and its update's memory (hf). An entry is `bench(args, verb) -> exit code`, where `verb` is the
CLI's (threads, --model, one-line failures)."""
from agentrl.core.registry import Registry

BENCHES = Registry("bench", "bench --backend",
                   builtin={"tinyagent": "agentrl.bench.steps", "hf": "agentrl.bench.hf"})
