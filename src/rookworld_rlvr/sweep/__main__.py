"""`python -m rookworld_rlvr.sweep ...`: the same as `rookworld sweep ...`."""

import sys

from rookworld_rlvr.sweep.cli import main

sys.exit(main())
