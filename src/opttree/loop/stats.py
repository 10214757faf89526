"""What a speculative generate() call did, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tree.draft_tree import DraftTree


@dataclass
class LayerTiming:
    """One ``drafter.expand`` call: how many nodes it expanded and how long it took."""

    width: int
    seconds: float


@dataclass
class StepStats:
    tree_size: int  # draft nodes verified
    tree_depth: int
    expected_length: float  # E(A) = Σp̂ of the verified tree
    accepted: int  # draft tokens the target agreed with (the bonus token not counted)
    emitted: int  # tokens this step added: accepted + bonus, fewer if generation stopped inside it
    draft_forwards: int  # draft-model forwards this step (the catch-up forward included)
    draft_seconds: float  # the whole drafting phase: the drafter's calls and the tree building
    verify_seconds: float
    tree: DraftTree | None = None  # the verified draft tree (tokens, parents, p̂), for a look at it
    accepted_nodes: list[int] | None = None  # node ids of `tree` the target accepted, root to leaf
    rows: int = 1  # batch rows verified in this step's forward (a batch step sums its rows' figures)
    root_seconds: float = 0.0  # of draft_seconds: drafter.root_probs() (the catch-up forward)
    layers: list[LayerTiming] = field(default_factory=list)  # of draft_seconds: each drafter.expand_probs()

    @property
    def build_seconds(self) -> float:
        """Drafting time outside the drafter's calls: top-k, pools, masks, the budget policy."""
        return max(self.draft_seconds - self.root_seconds - sum(t.seconds for t in self.layers), 0.0)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: list[StepStats] = field(default_factory=list)
    # a batch (rows.py): each row's own stats, in the batch's order; ``steps`` then holds one
    # StepStats per batched step, summed over the rows in it (tree_size, accepted, emitted, E(A))
    rows: list["GenerationStats"] | None = None

    @property
    def target_forwards(self) -> int:
        """Verification forwards (one per step) plus the prompt's prefill."""
        return len(self.steps) + 1

    @property
    def accept_lengths(self) -> list[int]:
        """Tokens emitted per step (accepted + bonus), Spec-Bench's ``accept_lengths``."""
        return [s.emitted for s in self.steps]

    @property
    def mean_accepted_tokens(self) -> float:
        """τ: mean tokens emitted per verification forward (for a batch: summed over its rows;
        each row's own τ is ``rows[b].mean_accepted_tokens``)."""
        return self.new_tokens / max(len(self.steps), 1)

    @property
    def expected_lengths(self) -> list[float]:
        return [s.expected_length for s in self.steps]

    @property
    def tree_sizes(self) -> list[int]:
        return [s.tree_size for s in self.steps]

    def summary(self) -> str:
        draft = sum(s.draft_seconds for s in self.steps)
        verify = sum(s.verify_seconds for s in self.steps)
        return (
            f"{self.new_tokens} new tokens in {len(self.steps)} steps: τ={self.mean_accepted_tokens:.2f} "
            f"tokens/step, mean tree {sum(self.tree_sizes) / max(len(self.steps), 1):.1f} nodes, "
            f"draft {draft:.2f}s, verify {verify:.2f}s"
        )
