"""Policy backends: what the sampler, trainer, evaluation, invariants, checkpoints and bench need of a policy
(`base.PolicyBackend`), and the registry of the models that provide it (`registry.BACKENDS`)."""
