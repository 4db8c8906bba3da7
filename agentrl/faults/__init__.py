"""Fault injection: the registry of seam overrides, the fault catalogue, its signatures, the length-bias study."""
