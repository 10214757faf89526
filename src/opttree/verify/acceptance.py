"""What one step's walk over the tree accepted (walk.py's argmax walk, sampling.py's verifiers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

# choose(emitted, logits) -> (token, scores)
#   emitted: tokens emitted so far this step (the context beyond the committed sequence)
#   logits:  [vocab] float32, the target's raw logits at the current node
#   returns: the target's token and the processed scores it was picked from ([vocab])
Choose = Callable[[list[int], torch.Tensor], "tuple[int, torch.Tensor]"]


@dataclass
class Acceptance:
    """One step's outcome. ``tokens`` = accepted draft tokens followed by the bonus token."""

    nodes: list[int] = field(default_factory=list)  # accepted tree nodes, root to leaf
    tokens: list[int] = field(default_factory=list)  # len(nodes) + 1
    scores: list[torch.Tensor] = field(default_factory=list)  # [vocab] per emitted token (see rows)
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] per emitted token (see rows)
    pool_ids: list[int] | None = None  # the accepted nodes' pool ids, when the walk read them too
    # greedy_walk without processors: the scores and logits of emitted token j are row rows[j] of
    # the step's logits, made into the two lists only on request (:func:`with_rows`)
    rows: list[int] | None = None
    tree_depth: int | None = None  # the walked tree's depth, when the walk read it too
    # greedy_walk: the path on the logits' device too, so that moving its cache slots and appending its
    # tokens copies nothing from the host (on a GPU such a copy waits for the stream)
    device_rows: torch.Tensor | None = None  # [accepted + 1] long, = rows: 0, then 1 + each accepted node
    device_tokens: torch.Tensor | None = None  # [accepted + 1] long, = tokens

    @property
    def accepted(self) -> int:
        return len(self.nodes)
