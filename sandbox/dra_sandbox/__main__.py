from dra_sandbox.cli import main

raise SystemExit(main())
