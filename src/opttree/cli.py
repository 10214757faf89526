"""The ``opttree`` command (also ``python -m opttree``): ``opttree distill ...``, ``opttree bench ...``,
``opttree arguments``, ``opttree export ...`` and ``opttree smollm2 save FOLDER``."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "distill": ("opttree.distill.cli", "train a same-vocabulary draft for a target (hours on a CPU; see --help)"),
    "bench": ("opttree.bench.cli", "Spec-Bench side by side with plain generate() and HF assisted generation"),
    "arguments": ("opttree.integration.contract_page",
                  "generate()'s arguments with a draft: honoured, refused, not applying (docs/arguments.md)"),
    "export": ("opttree.loading.export_cli", "write a draft head in the EAGLE-3 layout vLLM and SGLang serve"),
    "smollm2": ("opttree.smollm2", "save FOLDER: SmolLM2-135M-Instruct as a plain HF folder (vLLM, SGLang load it)"),
}


def usage() -> str:
    lines = [f"usage: opttree {{{','.join(COMMANDS)}}} [options]   (opttree COMMAND --help for its options)",
             "       opttree --version", ""]
    lines += [f"  {name:9s} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 (done, or help asked for), 2 (no or an unknown command), else the command's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] in (["-V"], ["--version"]):
        from . import __version__

        print(f"opttree {__version__}")
        return 0
    if not argv or argv[0] not in COMMANDS:
        problem = "no command given" if not argv else f"unknown command {argv[0]!r}"
        print(f"{usage()}\n\nopttree: error: {problem}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:], prog=f"opttree {argv[0]}") or 0)


if __name__ == "__main__":
    sys.exit(main())
