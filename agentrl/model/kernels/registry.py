"""The kernel sets a TinyAgent can run on, by name (their entries live in agentrl.model.kernels.ops, imported on
first use: naming them needs no torch)."""
from agentrl.core.registry import Registry

KERNELS = Registry("kernel set", field="kernels",
                   builtin={"fixed": "agentrl.model.kernels.ops", "torch": "agentrl.model.kernels.ops"})
