"""Load the target a draft is made for (``opttree distill --target``, recipes)."""

from __future__ import annotations

from pathlib import Path

import torch


def load_target(path: str | Path):
    """``(model, tokenizer)`` from ``"smollm2"`` (as ``opttree bench``), an HF folder or a folder holding one
    GGUF file (fp32, sdpa)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if str(path) == "smollm2":
        from ...smollm2 import load_smollm2

        return load_smollm2()
    path = Path(path)
    ggufs = sorted(path.glob("*.gguf"))
    extra = {"gguf_file": ggufs[0].name} if ggufs and not (path / "config.json").exists() else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa", **extra
    )
    return model.eval(), tokenizer
