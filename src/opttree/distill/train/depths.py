"""Agreement at tree depths 1, 2, 3, ... given that the path so far was accepted.

The unrolled passes of a head (:func:`opttree.distill.train.head_train.unrolled`) play, at position
``j`` of pass ``d``, the depth-``d + 1`` node of a chain rooted at ``r = j - d`` whose ancestors
are the text's own tokens ``r + 1 .. j``. Those ancestors are what a verifier accepts only when
the head drafted them, i.e. when passes ``0 .. d - 1`` agreed at ``r .. j - 1``. So:

- *depth agreement* (unconditional): how often pass ``d`` agrees, over every root;
- *path agreement*: how often pass ``d`` agrees at the roots whose passes ``0 .. d - 1`` all
  agreed: the acceptance rate of the depth-``d + 1`` drafted token in a chain;
- ``P(the first d drafted tokens are all accepted)`` = the product of the path agreements, and a
  chain of ``D`` drafted tokens then yields ``1 + sum_d P(first d accepted)`` tokens per target
  forward (its τ; the 1 is the target's own token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DepthCounts:
    """Counts per depth (index 0 = depth 1), summed over texts.

    - ``hits`` / ``tokens``: agreements and roots at each depth (unconditional);
    - ``path_hits`` / ``path_tokens``: agreements at each depth among the roots whose path up to
      that depth was accepted, and the number of such roots;
    - ``chain_hits`` / ``roots``: over the roots deep enough for every depth, how many had their
      first 1, 2, ... drafted tokens all accepted (τ's numerators and denominator)."""

    depths: int
    hits: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    path_hits: list[int] = field(default_factory=list)
    path_tokens: list[int] = field(default_factory=list)
    chain_hits: list[int] = field(default_factory=list)
    roots: int = 0

    LISTS = ("hits", "tokens", "path_hits", "path_tokens", "chain_hits")

    def __post_init__(self):
        for name in self.LISTS:
            if not getattr(self, name):
                setattr(self, name, [0] * self.depths)

    def add(self, other: "DepthCounts") -> "DepthCounts":
        summed = {n: [a + b for a, b in zip(getattr(self, n), getattr(other, n))] for n in self.LISTS}
        return DepthCounts(self.depths, **summed, roots=self.roots + other.roots)

    def agreement(self) -> list[float]:
        return [h / max(t, 1) for h, t in zip(self.hits, self.tokens)]

    def path_agreement(self) -> list[float]:
        """Acceptance rate at each depth given the path so far was accepted."""
        return [h / max(t, 1) for h, t in zip(self.path_hits, self.path_tokens)]

    def chain_tau(self) -> float:
        """Tokens per target forward of a chain of ``depths`` drafted tokens (greedy, one per depth)."""
        return 1.0 + sum(h / max(self.roots, 1) for h in self.chain_hits)


def shift(hit: torch.Tensor, d: int) -> torch.Tensor:
    """[L] bool indexed by position -> indexed by root ``r = position - d`` (False past the end)."""
    out = torch.zeros_like(hit)
    out[:hit.shape[0] - d] = hit[d:]
    return out


def depth_counts(hits: list[torch.Tensor], scored: torch.Tensor) -> DepthCounts:
    """Counts of one text. ``hits[d]`` [L] bool: pass ``d`` at position ``j`` agrees with the
    text's token ``j + 1``; ``scored`` [L] bool: the roots that count (answer positions whose
    next token exists). A root ``r`` counts at depth ``d + 1`` when ``r + d`` is scored too."""
    depths = len(hits)
    out = DepthCounts(depths)
    valid = [scored.clone()]  # valid[d] [L]: roots r with r .. r + d scored
    for d in range(1, depths):
        valid.append(valid[-1] & shift(scored, d))
    accepted = scored.clone()  # roots whose path is accepted so far
    chain = valid[-1].clone()
    for d in range(depths):
        at = shift(hits[d], d)  # [L] by root: the depth-(d + 1) node agrees
        out.hits[d], out.tokens[d] = int((at & valid[d]).sum()), int(valid[d].sum())
        alive = accepted & valid[d]
        out.path_tokens[d] = int(alive.sum())
        accepted = alive & at
        out.path_hits[d] = int(accepted.sum())
        chain &= at
        out.chain_hits[d] = int(chain.sum())
    out.roots = int(valid[-1].sum())
    return out
