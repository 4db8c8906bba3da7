"""Evaluation: sampling with own generators, behaviour analysis, statistics."""
