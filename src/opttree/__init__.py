"""opttree: lossless speculative decoding with adaptive draft trees for HF transformers.

The folders, top down: ``integration/`` (the face: the ways into generate()), ``loop/`` (the decoding
loop), ``drafters/``, ``budget/`` and ``verify/`` below it, ``tree/`` and ``hf/`` at the ground;
``tools/``, ``distill/`` and ``bench/`` apart. DESIGN.md has the map.
"""

from .drafters import Drafter, MixedDrafter
from .integration import (
    SpeculativeDecoderOnlyOutput,
    SpeculativeGenerationMixin,
    SpeculativeGenerator,
    speculative,
    speculative_generate,
)
from .loop.stats import GenerationStats, StepStats
from .tree import DraftTree
from .tree.builder import BuiltTree, build_opt_tree
from .tree.config import TreeConfig

__all__ = [
    "BuiltTree", "DraftTree", "Drafter", "GenerationStats", "MixedDrafter", "SpeculativeDecoderOnlyOutput",
    "SpeculativeGenerationMixin", "SpeculativeGenerator", "StepStats", "TreeConfig", "build_opt_tree", "load_draft",
    "speculative", "speculative_generate",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``load_draft`` on first use: ``opttree.distill`` is imported only by those who load a draft folder."""
    if name == "load_draft":
        from .distill import load_draft

        return load_draft
    raise AttributeError(f"module 'opttree' has no attribute {name!r}")
