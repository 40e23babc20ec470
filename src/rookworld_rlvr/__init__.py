"""rookworld-rlvr: GRPO with verifiable chess rewards for RookWorld language models."""

__version__ = "0.1.0"
