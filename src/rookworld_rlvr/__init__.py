"""rookworld-rlvr: GRPO with verifiable chess rewards for RookWorld language models.

Owns the version. Imports nothing: each module is imported where it is used (README: Layout).
"""

__version__ = "0.1.0"
