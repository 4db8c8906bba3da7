"""Training: rollouts, objectives, the one GRPO loop, starting policies, invariants, guards."""
