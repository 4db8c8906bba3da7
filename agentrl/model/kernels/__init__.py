"""TinyAgent's kernels: fixed-order C++ (fixed.cpp, built once per machine by build.py) behind differentiable
functions and kernel sets (ops.py)."""
from agentrl.model.kernels.ops import KERNELS, KernelSet, exp, sqrt

__all__ = ["KERNELS", "KernelSet", "exp", "sqrt"]
