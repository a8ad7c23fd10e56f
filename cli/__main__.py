"""``python -m cli``: the `rlhf` command."""

import sys

from cli.main import main

sys.exit(main())
