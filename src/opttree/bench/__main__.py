"""``python -m opttree.bench --questions question.jsonl --draft DRAFT``: see cli.py."""

import sys

from .cli import main

sys.exit(main())
