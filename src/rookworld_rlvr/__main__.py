from rookworld_rlvr.cli import main

raise SystemExit(main())
