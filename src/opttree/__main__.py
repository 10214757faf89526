"""``python -m opttree ...``: the ``opttree`` command (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
