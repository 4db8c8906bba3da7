"""TinyAgent's kernels: fixed-order C++ (fixed.cpp and fixed_math.h, built once per machine by build.py) behind
differentiable functions and kernel sets (ops.py), named in a torch-free registry (registry.py)."""
