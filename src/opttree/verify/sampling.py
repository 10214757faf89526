"""Lossless sampling on draft trees: the draft's warped q and two verifiers, ``"rrs"`` and ``"traversal"``.

Glossary (see walk.py for ``"match"``):

- *target law* P at a node: softmax of the target's logits there after generate()'s logits
  processors, with the path to the node as context. Every verifier below emits tokens distributed
  exactly as sampling from these laws one token at a time.
- *proposal law* Q of a child: the law the child's token was drawn from, given its earlier
  siblings. For a tree from ``strategy="sampled"`` it is the draft's q at the parent (``draws=
  "iid"``) or q without the earlier siblings' tokens, renormalised (``"without_replacement"``).
  For every other tree (children are the draft's top tokens, a deterministic function of q) it is
  the point mass on the child's token: conditioning on the tree makes the draft deterministic,
  and that is always exact.
- *residual*: after a child is rejected, P becomes norm([αP - Q]₊).

Verifiers (``TreeConfig.verifier``):

- ``"rrs"``: recursive rejection sampling over siblings, top-down (SpecInfer, Miao et al.,
  arXiv 2305.09781; without replacement: Sequoia, Chen et al., arXiv 2402.12374). At a node, each
  child in turn is accepted with probability min(1, P(x)/Q(x)); a rejection replaces P by the
  residual norm([P - Q]₊); when no child is left, the bonus token is drawn from P. With point-mass
  Q (deterministic top-k children) the residual is P with the rejected token removed, so "rrs"
  emits exactly the same distribution as ``"match"`` (sample from P, follow the child carrying
  the sample): the two coincide in distribution (not draw for draw). Its gain needs children
  *sampled* from q.
- ``"traversal"``: Traversal Verification (Weng et al., arXiv 2505.12398), leaf-to-root. A node
  carries a sequence-level acceptance weight α = min(1, α(parent) · P(x)/Q(x)) (α = 1 at the
  root); subtrees are visited in post-order, so the deepest first leaf is tried first with the
  whole path's ratio, and a rejected child only updates its parent (P ← norm([αP - Q]₊),
  α ← R / (R + 1 - α) with R = Σ[αP - Q]₊), keeping the sibling subtrees alive. A node whose
  children are all rejected is itself accepted with its updated α, the bonus token drawn from its
  updated P; the root always is. On a chain this is block verification (Sun et al., arXiv
  2403.10444); on one layer it is "rrs". Why it is exact: by induction, a subtree entered with
  weight α emits a first token y with probability αP(y) — the first child contributes
  min(Q(y), αP(y)), is rejected with probability R + 1 - α, and the rest then contributes
  α'P'(y) = [αP(y) - Q(y)]₊.

Both need, at every node, only the children's proposal laws; a tree whose children are drawn
from q must decide each node's existence before drawing its token, from earlier-drawn tokens
in depth-first order only (the verifiers visit subtrees in that order):
:func:`opttree.tree.sampled.build_sampled_tree` does. Greedy decoding ignores all this: every verifier
is then the argmax walk (walk.py).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from ..tree.builder import BuiltTree
from ..tree.draft_tree import DraftTree
from ..tree.sampled import SampledTree, generator_device
from .acceptance import Acceptance

logger = logging.getLogger(__name__)

# transformers' warpers that only look at the scores (not at the context): the draft applies them as they are
CONTEXT_FREE_WARPERS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                        "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper")

# process(emitted, row) -> scores
#   emitted: tokens on the path from the root to the node (the context beyond the committed sequence)
#   row:     [vocab] float32, the target's raw logits at the node
#   returns: [vocab] float, after generate()'s logits processors
Process = Callable[[list[int], torch.Tensor], torch.Tensor]


# ---------------------------------------------------------------------------------------------
# the draft's q under the target's warpers


def draft_to_probs(logits_processor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A drafter's ``to_probs`` (logits [k, vocab] -> probabilities [k, vocab]) that applies the
    context-free warpers of generate()'s ``logits_processor`` (temperature, top-k, top-p, min-p,
    typical, epsilon, eta) before the softmax, so the tree is built from the q the verifier sees.

    Processors that need the context (repetition penalty, no-repeat n-grams, ...) are left out on
    the draft side: that only makes q a little less calibrated, never the output less exact.
    """
    from transformers.generation import logits_process  # (this module is otherwise torch only)

    kinds = tuple(getattr(logits_process, name) for name in CONTEXT_FREE_WARPERS)
    warpers = [p for p in (logits_processor or []) if isinstance(p, kinds)]

    def to_probs(logits: torch.Tensor) -> torch.Tensor:  # [k, vocab] -> [k, vocab]
        scores = logits.float()
        dummy_ids = torch.zeros(scores.shape[0], 1, dtype=torch.long, device=scores.device)
        for warper in warpers:
            scores = warper(dummy_ids, scores)
        return torch.softmax(scores, dim=-1)

    return to_probs


# ---------------------------------------------------------------------------------------------
# the verifiers


class _Laws:
    """Target and proposal laws at the nodes of one step's tree (computed on demand)."""

    def __init__(self, built: BuiltTree, tree: DraftTree, logits: torch.Tensor, process: Process):
        self.tree, self.logits, self.process = tree, logits, process  # logits: [n + 1, vocab]
        self.tokens = tree.tokens.tolist()
        self.parents = tree.parents.tolist()
        self.kids = tree.children()
        self.draws = built.draws if isinstance(built, SampledTree) else None
        self.draft_probs = built.draft_probs
        self._scores: dict[int, torch.Tensor] = {}

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[i] for i in self.tree.path_to(node)] if node >= 0 else []

    def scores(self, node: int) -> torch.Tensor:
        """[vocab]: the target's processed scores at ``node`` (-1 = the root)."""
        if node not in self._scores:
            self._scores[node] = self.process(self.path_tokens(node), self.logits[node + 1])
        return self._scores[node]

    def target(self, node: int) -> torch.Tensor:
        """[vocab] float64: P at ``node``."""
        return torch.softmax(self.scores(node).double(), dim=-1)

    def proposal(self, node: int, token: int, tried: list[int]) -> torch.Tensor:
        """[vocab] float64: the law the child carrying ``token`` was drawn from, after ``tried``."""
        if self.draws is None:  # deterministic children: a point mass
            q = torch.zeros(self.logits.shape[-1], dtype=torch.float64, device=self.logits.device)
            q[token] = 1.0
            return q
        q = self.draft_probs[node].to(device=self.logits.device, dtype=torch.float64)
        if self.draws == "without_replacement" and tried:
            q = q.clone()
            q[tried] = 0.0
            q = q / q.sum()
        return q

    def acceptance(self, end: int, bonus: int) -> Acceptance:
        """The accepted path root→``end`` (-1: none) and the bonus token, with the target's scores
        and logits at the node before each emitted token (as generate() would report them)."""
        nodes = self.tree.path_to(end) if end >= 0 else []
        before = [-1] + nodes
        return Acceptance(nodes=nodes, tokens=[self.tokens[i] for i in nodes] + [bonus],
                          scores=[self.scores(i) for i in before], logits=[self.logits[i + 1] for i in before])


def _uniform(generator, device) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64, device=generator_device(generator, device)))


def _draw(p: torch.Tensor, generator) -> int:  # p: [vocab]
    return int(torch.multinomial(p.to(generator_device(generator, p.device)), 1, generator=generator))


def _residual(weighted: torch.Tensor, q: torch.Tensor):
    """[αP - Q]₊ and its mass R (both float64)."""
    resid = (weighted - q).clamp_(min=0.0)
    return resid, float(resid.sum())


def rrs_walk(built: BuiltTree, tree: DraftTree, logits: torch.Tensor, process: Process,
             generator: torch.Generator | None = None) -> Acceptance:
    """Recursive rejection sampling, top-down (module docstring). logits: [n + 1, vocab] float32."""
    laws = _Laws(built, tree, logits, process)
    device = logits.device
    node = -1
    while True:
        p = laws.target(node)
        tried: list[int] = []
        accepted = None
        for child in laws.kids[node + 1]:
            token = laws.tokens[child]
            q = laws.proposal(node, token, tried)
            if q[token] > 0 and _uniform(generator, device) * float(q[token]) < float(p[token]):
                accepted = child
                break
            resid, mass = _residual(p, q)
            if mass > 0:  # (zero mass: the rejection had probability 0; only rounding gets here)
                p = resid / mass
            tried.append(token)
        if accepted is None:
            return laws.acceptance(node, _draw(p, generator))
        node = accepted


def traversal_walk(built: BuiltTree, tree: DraftTree, logits: torch.Tensor, process: Process,
                   generator: torch.Generator | None = None) -> Acceptance:
    """Traversal Verification, leaf-to-root (module docstring). logits: [n + 1, vocab] float32."""
    laws = _Laws(built, tree, logits, process)
    device = logits.device

    def visit(node: int, alpha: float):
        """Post-order over ``node``'s subtree, entered with weight α: (accepted node, its P) or None."""
        p = laws.target(node)
        tried: list[int] = []
        for child in laws.kids[node + 1]:
            token = laws.tokens[child]
            q = laws.proposal(node, token, tried)
            if q[token] > 0 and p[token] > 0:
                found = visit(child, min(1.0, alpha * float(p[token]) / float(q[token])))
                if found is not None:
                    return found
            # the child's subtree is rejected: P <- norm([αP - Q]₊), α <- R / (R + 1 - α)
            resid, mass = _residual(alpha * p, q)
            rejection = mass + 1.0 - alpha
            if mass > 0:
                p = resid / mass
            alpha = mass / rejection if rejection > 0 else alpha  # (0: a rejection of probability 0)
            tried.append(token)
        if node < 0 or _uniform(generator, device) < alpha:
            return node, p
        return None

    end, p = visit(-1, 1.0)
    return laws.acceptance(end, _draw(p, generator))

