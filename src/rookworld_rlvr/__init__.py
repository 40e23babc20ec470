"""rookworld-rlvr: GRPO with verifiable chess rewards for RookWorld language models.

Owns the version, and the parent process as the package was first imported. Imports nothing but
os: each module is imported where it is used (README: Layout).
"""

import os as _os

__version__ = "0.1.0"
# torchrun's pid, in a process torchrun started: read here, before the seconds of imports during
# which torchrun may already die (grpo.distributed.watch_torchrun)
PARENT_AT_IMPORT = _os.getppid()
