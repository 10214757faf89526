"""Tree settings: one validated, frozen dataclass and the only home of their defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .registry import Strategy, Verifier, strategy as strategy_named, verifier as verifier_named  # registry.py

# The largest node budget. A step's memory is quadratic in it: the builder's pool keeps a [P, P]
# bool ancestor mask over up to max_depth × nodes drafted nodes (about 100 MB at 1024 nodes and the
# default depth 10; 10 GB at 10 000 nodes), and the target verifies under a [nodes + 1,
# context + nodes + 1] attention mask (eager attention: one per head). Useful trees are far
# smaller: "auto" never verifies more than 64 nodes (latency.AUTO_MAX_NODES); past the positions
# an accelerator verifies at the price of one (tens to a few hundred), each node costs more time
# than its small p̂ can win back.
MAX_NODES = 1024


@dataclass(frozen=True)
class TreeConfig:
    """How the draft tree is grown each step (OPT-Tree, arXiv 2406.17276, Algorithm 1).

    nodes:     the node budget n: the final tree keeps the ``nodes`` nodes of highest path
               probability p̂ (the root is not counted); at most MAX_NODES (1024).
    threshold: δ: drafting goes one layer deeper only while E(A) = Σp̂ of the best ``nodes``-node
               tree grows by more than δ.
               ``nodes="auto"`` / ``threshold="auto"``: chosen each step for the most tokens per second
               on this machine (measured latencies; see opttree.budget).
    max_depth: the deepest layer ever drafted.
    strategy:  how the tree is grown, a name in :data:`~opttree.tree.registry.STRATEGIES`; ``"opt"`` is OPT-Tree; the
               others: strategies.py (``"sampled"``, children drawn from q: sampled.py).
    verifier:  how the target accepts tokens, a name in :data:`~opttree.tree.registry.VERIFIERS`; ``"match"``: the
               target picks its own token at a node (argmax, or a sample) and the walk follows the
               child that carries it; ``"rrs"`` (recursive rejection sampling) and ``"traversal"``
               (Traversal Verification): verify/sampling.py. All are lossless; greedy decoding always matches.
    static_tree: for ``strategy="static"``: the tree as root-to-node paths of sibling ranks,
               e.g. ``((0,), (1,), (0, 0))``.

    These field defaults complete the arguments a user gives. A generate() call given NEITHER
    ``nodes`` NOR ``threshold`` runs ``nodes="auto", threshold="auto"`` where it can (opttree.integration.defaults).
    """

    nodes: int = 60
    threshold: float = 0.5
    max_depth: int = 10
    strategy: str = "opt"
    verifier: str = "match"
    static_tree: tuple | None = None
    # the records of ``strategy`` and ``verifier`` (registry.py), looked up once here: what grows and verifies reads them
    strategy_record: Strategy = field(init=False, repr=False, compare=False)
    verifier_record: Verifier = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.nodes != "auto" and (isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1):
            raise ValueError(f"nodes must be an integer >= 1 (the tree's node budget) or 'auto', got {self.nodes!r}")
        if self.nodes != "auto" and self.nodes > MAX_NODES:
            raise ValueError(
                f"nodes must be at most {MAX_NODES} (opttree.tree.config.MAX_NODES: a step's memory grows with the "
                f"square of the node budget), got {self.nodes!r}; pass nodes='auto' (the fastest tree this "
                "machine measured) or a budget such as 60"
            )
        if self.threshold != "auto" and (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, (int, float))
            or not math.isfinite(self.threshold)
            or self.threshold < 0
        ):
            raise ValueError(
                f"threshold must be a finite number >= 0 (the minimum gain in E(A) that justifies "
                f"drafting one more layer; 0.5 is a good start) or 'auto', got {self.threshold!r}"
            )
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int) or self.max_depth < 1:
            raise ValueError(f"max_depth must be an integer >= 1, got {self.max_depth!r}")
        # an unknown name is refused, naming the known ones
        object.__setattr__(self, "strategy_record", strategy_named(self.strategy))
        object.__setattr__(self, "verifier_record", verifier_named(self.verifier))
