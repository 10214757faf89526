"""opttree: lossless speculative decoding with adaptive draft trees for HF transformers.

The folders, top down: ``integration/`` (the face: the ways into generate()), ``loop/`` (the decoding
loop) and ``loading/`` (a draft folder made ready), ``drafters/``, ``budget/`` and ``verify/`` below
them, ``tree/``, ``hf/`` and ``kernels/`` at the ground; ``tools/``, ``distill/`` (training) and ``bench/`` apart.
DESIGN.md has the map.
"""

from .drafters import Drafter, MixedDrafter
from .integration import (
    SpeculativeDecoderOnlyOutput,
    SpeculativeGenerationMixin,
    SpeculativeGenerator,
    speculative,
    speculative_generate,
)
from .loading import export_draft, load_draft
from .loop.stats import GenerationStats, StepStats
from .tree import DraftTree
from .tree.builder import BuiltTree, build_opt_tree
from .tree.config import TreeConfig

__all__ = [
    "BuiltTree", "DraftTree", "Drafter", "GenerationStats", "MixedDrafter", "SpeculativeDecoderOnlyOutput",
    "SpeculativeGenerationMixin", "SpeculativeGenerator", "StepStats", "TreeConfig", "build_opt_tree", "export_draft",
    "load_draft",
    "speculative", "speculative_generate",
]
__version__ = "0.1.0"
