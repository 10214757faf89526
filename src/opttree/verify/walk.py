"""Which draft tokens the target keeps: walk the tree from the root.

At the root, and then at each accepted node, the target picks its own next token from its
logits at that node (argmax when greedy, a sample when sampling, always after the same logits
processors generate() would apply). If a child of the current node carries that token, the child
is accepted and the walk goes on from it; otherwise the picked token is the *bonus* token and the
step ends. Every emitted token is thus exactly the token the target alone would have produced
from the same context (greedy), or a draw from the target's own distribution there (sampling,
"sample-and-match": lossless whatever the tree). This is ``verifier="match"``, what the official
OPT-Tree code does; ``"rrs"`` (recursive rejection sampling) and ``"traversal"`` (Traversal
Verification) live in sampling.py and are dispatched from :func:`verify` when sampling. The three
records (:class:`~opttree.tree.registry.Verifier`) are registered at the end of this module.
"""

from __future__ import annotations

import torch

from ..tree.draft_tree import DraftTree
from ..tree.registry import Verifier, register_verifiers
from .acceptance import Acceptance, Choose
from .sampling import rrs_walk, traversal_walk

__all__ = ["Acceptance", "Choose", "greedy_choice", "greedy_walk", "sampled_choice", "verify", "walk_tree", "with_rows"]


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


def greedy_walk(tree: DraftTree, logits: torch.Tensor, pool_ids: torch.Tensor, depth: int | None = None) -> Acceptance:
    """The argmax walk for every node at once, with ONE host read (no logits processors: the
    scores are the raw logits).

    tree: on logits' device; logits: [n + 1, vocab] (row 0 the root, 1 + i node i); pool_ids:
    [n] long, each node's pool id; depth: the tree's depth if known (else n bounds it).
    A node is accepted when its token is the target's argmax at its parent and so is every
    ancestor's: the accepted nodes form one path (siblings carry distinct tokens), in tree order.
    """
    n = len(tree)
    choice = logits.argmax(dim=-1)  # [n + 1] the target's token at the root and at each node
    if n == 0:
        return Acceptance([], choice.tolist(), rows=[0], pool_ids=[], tree_depth=0)
    match = tree.tokens == choice[tree.parents + 1]  # [n] the node carries its parent's argmax
    on_path = ~(tree.ancestor_mask() & ~match).any(dim=1)  # [n] so do all its ancestors
    d = min(depth or n, n)
    order = torch.sort(torch.where(on_path, torch.arange(n, device=logits.device), n)).values[:d]  # [d]
    path = order.clamp(max=n - 1)  # [d]: the accepted nodes first, then filler
    rows = torch.cat([path.new_zeros(1), path + 1])  # [d + 1] the root's row, then each path node's
    emitted = choice[rows]  # [d + 1]
    counts = torch.stack([on_path.sum(), tree.depths().max()])  # [2] accepted, the tree's depth
    packed = torch.cat([counts, path, pool_ids.to(path.device)[path], emitted]).tolist()
    a = packed[0]
    nodes = packed[2:2 + a]
    return Acceptance(nodes, packed[2 + 2 * d:3 + 2 * d + a], pool_ids=packed[2 + d:2 + d + a],
                      rows=[0] + [1 + i for i in nodes], tree_depth=packed[1], device_rows=rows[:a + 1],
                      device_tokens=emitted[:a + 1])


def with_rows(acceptance: Acceptance, logits: torch.Tensor) -> Acceptance:
    """Fill ``scores`` and ``logits`` of a :func:`greedy_walk` acceptance from the step's logits."""
    if acceptance.rows is not None and not acceptance.logits:
        acceptance.logits = [logits[r] for r in acceptance.rows]
        acceptance.scores = list(acceptance.logits)
    return acceptance


def verify(built, tree: DraftTree, logits: torch.Tensor, choose: Choose, config, process=None,
           generator: torch.Generator | None = None) -> Acceptance:
    """Dispatch on ``config.verifier``. built: the step's BuiltTree (``built.draft_probs`` holds the
    draft's q where a verifier needs it); tree: its tree on the target's device;
    logits: [n + 1, vocab] float32, the target's raw logits (row 0 = root).
    process: ``(emitted, row) -> scores``, generate()'s logits processors at a node (see
    sampling.py), given only when sampling; generator: the sampling verifiers' randomness.

    Greedy decoding (``process`` None) always takes the argmax walk: every verifier's output then
    is the target's own greedy output. ``"rrs"`` and ``"traversal"``: sampling.py (their records' walks)."""
    walk = config.verifier_record.sampling_walk
    if walk is None or process is None:
        return walk_tree(tree, logits, choose)
    return walk(built, tree, logits, process, generator)


def greedy_choice(scores: torch.Tensor, generator=None) -> int:
    return int(torch.argmax(scores))


def sampled_choice(scores: torch.Tensor, generator=None) -> int:
    """A draw from softmax(scores), on the generator's device when one is given (a torch
    Generator only draws on its own device: a CPU generator with CUDA scores draws on the CPU)."""
    probs = torch.softmax(scores, dim=-1)
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


register_verifiers(  # one record per verifier (tree/registry.py): the docs list them in this order
    Verifier(name="match", summary="its own token at each node, greedy or sampled", sized_by_auto=True,
             sampling_walk=None),
    # checked against the draft's own q: the tree's shape is left to the strategy
    Verifier(name="rrs", summary="recursive rejection sampling", sized_by_auto=False, sampling_walk=rrs_walk),
    Verifier(name="traversal", summary="Traversal Verification", sized_by_auto=False, sampling_walk=traversal_walk),
)
