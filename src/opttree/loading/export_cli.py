"""``opttree export``: a draft folder loaded for its target and written in a published layout
(:func:`~opttree.loading.eagle_export.export_draft`)."""

from __future__ import annotations

import argparse

from .eagle import export_layouts
from .eagle_export import export_draft


def parser(prog: str = "opttree export") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Write a draft head in the layout vLLM and SGLang serve.")
    p.add_argument("draft", help="the head's folder (an EAGLE folder, or one written by `opttree distill`)")
    p.add_argument("out", help="the folder to write")
    p.add_argument("--target", required=True, help="the target model (a Hub name or a folder) the head drafts for")
    layouts = export_layouts()
    p.add_argument("--layout", default=layouts[0], choices=layouts, help="the layout to write (default: %(default)s)")
    return p


def main(argv: list[str] | None = None, prog: str = "opttree export") -> int:
    args = parser(prog).parse_args(argv)
    from transformers import AutoModelForCausalLM

    from .load import load_draft

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype="float32")
    try:
        folder = export_draft(load_draft(args.draft, target), args.out, layout=args.layout)
    except (ValueError, TypeError) as error:
        print(f"{prog}: error: {error}")
        return 1
    print(f"wrote {folder} ({args.layout})")
    return 0
