"""`python -m rookworld_rlvr ...`: the same as `rookworld ...` (`cli.main`). Owns nothing else;
imports only the command line."""

from rookworld_rlvr.cli import main

raise SystemExit(main())
