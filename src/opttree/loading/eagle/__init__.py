"""The published EAGLE layouts, one class each beside its folder format, and the registry that
picks one by config.json's ``architectures`` (as vLLM and SGLang keep one model class per
published architecture, looked up by name):

* :mod:`.eagle3`: ``Eagle3Head`` (EAGLE-3); :mod:`.speculators`: ``SpeculatorsHead`` (EAGLE-3 in
  speculators' folder); :mod:`.eagle1`: ``Eagle1Head`` (EAGLE-1/2, a plain architecture told apart
  by its weights);
* :mod:`.base`: ``PublishedHead``, what each layout declares (its config reader, key map, export or
  why it has none) and the shapes all read alike; :mod:`.fields`: a checked config.json field, the
  head's own RoPE.

A new layout is one module with its class and one line in :data:`ARCHITECTURES`; nothing else
names a layout (tests/test_eagle_registry.py holds it). Their forwards share
:class:`opttree.drafters.head.eagle.EagleHead`. Rules and sources: DESIGN.md, "EAGLE heads".
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from .base import PublishedHead
from .eagle1 import Eagle1Head
from .eagle3 import Eagle3Head
from .fields import CONFIG_FILE
from .speculators import SpeculatorsHead

#: config.json's ``architectures`` -> its head's class; a folder takes the first class (in this order) it names
ARCHITECTURES: dict[str, type[PublishedHead]] = {
    "Eagle3Speculator": SpeculatorsHead,
    "LlamaForCausalLMEagle3": Eagle3Head,
    "Eagle3LlamaForCausalLM": Eagle3Head,
    "LlamaForCausalLM": Eagle1Head,
    "Qwen2ForCausalLM": Eagle1Head,
    "MistralForCausalLM": Eagle1Head,
    "Qwen3ForCausalLM": Eagle1Head,
}


def register(architecture: str, cls: type[PublishedHead]) -> None:
    """Read folders whose config.json names ``architecture`` as ``cls`` (matched after those before)."""
    ARCHITECTURES[architecture] = cls


def unregister(architecture: str) -> None:
    ARCHITECTURES.pop(architecture, None)


def classes() -> list[type[PublishedHead]]:
    """The registered classes, each once, in the registry's order."""
    return list(dict.fromkeys(ARCHITECTURES.values()))


def export_layouts() -> tuple[str, ...]:
    """The ``layout=`` names :func:`~opttree.loading.eagle_export.export_draft` writes, in the registry's order."""
    return tuple(dict.fromkeys(cls.kind for cls in classes() if cls.cannot_export is None))


def head_class(raw: dict, path: Path, names: Callable[[], Collection[str]]) -> type[PublishedHead]:
    """The class of the head whose config.json is ``raw``: the first registered one its ``architectures``
    (or another field, :meth:`~.base.PublishedHead.marked_by`) names and whose weights fit
    (``names()``: their names, read only for a class that asks); an unknown one is refused by name."""
    architectures = raw.get("architectures") or []
    for cls in classes():
        named = any(isinstance(a, str) and ARCHITECTURES.get(a) is cls for a in architectures)
        if (named or cls.marked_by(raw)) and cls.weights_fit(names):
            return cls
    known = ", ".join(a + cls.note for a, cls in ARCHITECTURES.items())
    raise ValueError(f"{path / CONFIG_FILE}: {architectures!r} is no draft head's architecture (opttree reads "
                     f"{known}); a draft model's folder: load it yourself and pass the model, e.g. "
                     "AutoModelForCausalLM.from_pretrained(path, attn_implementation='sdpa')")


__all__ = ["ARCHITECTURES", "Eagle1Head", "Eagle3Head", "PublishedHead", "SpeculatorsHead", "classes",
           "export_layouts", "head_class", "register", "unregister"]
