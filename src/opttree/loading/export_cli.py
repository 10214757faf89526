"""``opttree export``: a draft folder loaded for its target and written in a published layout
(:func:`~opttree.loading.eagle_export.export_draft`). Every argument is checked before a model loads,
and each refusal is one line naming the fix (exit code 2); nothing is written unless all of it is."""

from __future__ import annotations

import argparse
from pathlib import Path

from .eagle import export_layouts
from .eagle_export import DTYPES, check_exportable, export_draft
from .files import META_FILE, check_folder, check_new_folder
from .hub import is_hub_id, is_hub_name
from .load import load_draft

TARGET_FORMS = ("give the folder of a from_pretrained model (config.json) or a Hub id org/name (SmolLM2 as such a "
                "folder: `opttree smollm2 save FOLDER`)")


class Parser(argparse.ArgumentParser):
    """Errors in one line, naming the fix (argparse's own print the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")


def parser(prog: str = "opttree export") -> Parser:
    p = Parser(prog=prog, description="Write a draft head in the layout vLLM and SGLang serve.")
    p.add_argument("draft", help="the head's folder (an EAGLE folder, or one written by `opttree distill`)")
    p.add_argument("out", help="the folder to write (new or empty)")
    p.add_argument("--target", required=True, help="the target model (a Hub name or a folder) the head drafts for")
    layouts = export_layouts()
    p.add_argument("--layout", default=layouts[0], choices=layouts, help="the layout to write (default: %(default)s)")
    p.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                   help="the weights' dtype (default: the head folder's own)")
    return p


def check_target(spec: str) -> None:
    """ValueError naming the fix for a ``--target`` that is no model's folder nor a Hub id. Nothing is loaded."""
    path = Path(spec)
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(f"--target {spec}: that folder holds no config.json; {TARGET_FORMS}")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--target {spec}: a file, not a folder; {TARGET_FORMS}")
    if not path.exists() and not is_hub_id(spec):
        raise ValueError(f"--target {spec}: no such folder ({path.absolute()}); {TARGET_FORMS}")


def checked(args) -> None:
    """Every argument that can be checked before a model loads (ValueError naming the fix)."""
    if not is_hub_name(args.draft):
        check_folder(Path(args.draft))
    check_new_folder(Path(args.out), "OUT ")
    check_target(args.target)


def dry_run(args, config) -> None:
    """An EAGLE head's folder read against the target's ``config`` on the meta device (no weight of the target
    read, nothing allocated), then checked to export: every refusal of its files, its fields, its fit to
    the target and its layout comes before the target loads. A Hub name, and an opttree folder (whose
    checks read the target's embedding), are checked once the target has loaded."""
    import torch
    from transformers import AutoModelForCausalLM

    if is_hub_name(args.draft) or (Path(args.draft) / META_FILE).is_file():
        return
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config)
    check_exportable(load_draft(args.draft, shell), args.layout)


def could_not_load(spec: str, error: Exception) -> str:
    return f"--target {spec}: could not load it ({str(error).splitlines()[0] if str(error) else ''}); {TARGET_FORMS}"


def main(argv: list[str] | None = None, prog: str = "opttree export") -> int:
    usage = parser(prog)
    args = usage.parse_args(argv)
    try:
        checked(args)
    except ValueError as error:
        usage.error(str(error))
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(args.target)
    except (OSError, ValueError) as error:  # a Hub id the Hub (or the cache) lacks, a broken config.json
        usage.error(could_not_load(args.target, error))
    try:
        dry_run(args, config)
    except (ValueError, TypeError) as error:
        usage.error(str(error))
    try:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype="float32")
    except (OSError, ValueError) as error:
        usage.error(could_not_load(args.target, error))
    try:
        folder = export_draft(load_draft(args.draft, target), args.out, layout=args.layout, dtype=args.dtype)
    except (ValueError, TypeError) as error:
        usage.error(str(error))
    print(f"wrote {folder} ({args.layout})")
    return 0
