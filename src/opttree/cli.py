"""The ``opttree`` command: ``opttree distill ...`` and ``opttree bench ...``."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "distill": ("opttree.distill.cli", "train a same-vocabulary draft for a target"),
    "bench": ("opttree.bench.cli", "Spec-Bench side by side with plain generate() and HF assisted generation"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: opttree {distill,bench} [options]\n")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:8s} {help_text}")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
