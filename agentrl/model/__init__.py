"""The policy: TinyAgent and its checkpoints."""
