"""TinyAgent: agentic-RL post-training on a toy coding gym."""
__version__ = "0.1.0"
