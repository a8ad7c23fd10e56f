"""``python -m cli``: the `rlhf` command."""

from cli.main import main

raise SystemExit(main())
