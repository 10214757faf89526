"""Which draft tokens the target keeps: walk the tree from the root.

At the root, and then at each accepted node, the target picks its own next token from its
logits at that node (argmax when greedy, a sample when sampling, always after the same logits
processors generate() would apply). If a child of the current node carries that token, the child
is accepted and the walk goes on from it; otherwise the picked token is the *bonus* token and the
step ends. Every emitted token is thus exactly the token the target alone would have produced
from the same context (greedy), or a draw from the target's own distribution there (sampling,
"sample-and-match": lossless whatever the tree). This is ``verifier="match"``, what the official
OPT-Tree code does; ``"rrs"`` (recursive rejection sampling) and ``"traversal"`` (Traversal
Verification) live in sampling.py and are dispatched from :func:`verify` when sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .tree import DraftTree

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
    scores: list[torch.Tensor] = field(default_factory=list)  # [vocab] per emitted token
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] per emitted token

    @property
    def accepted(self) -> int:
        return len(self.nodes)


def walk_tree(tree: DraftTree, logits: torch.Tensor, choose: Choose) -> Acceptance:
    """logits: [n + 1, vocab] float32; row 0 is the root, row 1 + i is node i."""
    children = tree.children()
    tokens = tree.tokens.tolist()
    result = Acceptance()
    node = -1
    while True:
        row = logits[node + 1]
        token, scores = choose(result.tokens, row)
        result.tokens.append(token)
        result.scores.append(scores)
        result.logits.append(row)
        child = next((c for c in children[node + 1] if tokens[c] == token), None)
        if child is None:
            return result
        result.nodes.append(child)
        node = child


def verify(built, tree: DraftTree, logits: torch.Tensor, choose: Choose, config, process=None,
           generator: torch.Generator | None = None) -> Acceptance:
    """Dispatch on ``config.verifier``. built: the step's BuiltTree (``built.draft_probs`` holds the
    draft's q where a verifier needs it); tree: its tree on the target's device;
    logits: [n + 1, vocab] float32, the target's raw logits (row 0 = root).
    process: ``(emitted, row) -> scores``, generate()'s logits processors at a node (see
    sampling.py), given only when sampling; generator: the sampling verifiers' randomness.

    Greedy decoding (``process`` None) always takes the argmax walk: every verifier's output then
    is the target's own greedy output. ``"rrs"`` and ``"traversal"``: sampling.py."""
    if config.verifier == "match" or process is None:
        return walk_tree(tree, logits, choose)
    from .sampling import SAMPLING_VERIFIERS  # (sampling.py imports Acceptance from here)

    if config.verifier in SAMPLING_VERIFIERS:
        return SAMPLING_VERIFIERS[config.verifier](built, tree, logits, process, generator)
    raise ValueError(f"unknown verifier {config.verifier!r}")


def greedy_choice(scores: torch.Tensor, generator=None) -> int:
    return int(torch.argmax(scores))


def sampled_choice(scores: torch.Tensor, generator=None) -> int:
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
