"""`python -m rookworld_rlvr.sweep ...`: the same as `rookworld sweep ...` (`sweep.cli.main`). Owns
nothing else; imports only the sweep's command line."""

import sys

from rookworld_rlvr.sweep.cli import main

sys.exit(main())
