"""`python -m agentrl bench`: the training step and its sampler (TinyAgent), the numerics modes side by
side, and a Hugging Face backend's sampler and update."""
