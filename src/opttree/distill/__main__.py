"""``python -m opttree.distill ...`` — same as ``opttree distill ...``."""

import sys

from .cli import main

sys.exit(main())
