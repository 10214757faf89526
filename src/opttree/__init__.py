"""opttree: lossless speculative decoding with adaptive draft trees for HF transformers."""

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
    "BuiltTree", "DraftTree", "GenerationStats", "SpeculativeDecoderOnlyOutput", "SpeculativeGenerationMixin",
    "SpeculativeGenerator", "StepStats", "TreeConfig", "build_opt_tree", "speculative", "speculative_generate",
]
__version__ = "0.1.0"
