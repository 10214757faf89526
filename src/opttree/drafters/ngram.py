"""A model-free drafter: prompt lookup with n-grams, proposing a TREE of continuations.

Prompt lookup (Saxena, "Prompt Lookup Decoding", 2023; ``prompt_lookup_num_tokens=`` in HF
generate()) copies the tokens that followed the last occurrence of the text's final n-gram. Here
every earlier occurrence counts: the draft's q for the token after a context is the empirical
frequency of each token that followed the context's last n tokens in the prompt and the text
generated so far, for the largest n ≤ ``max_ngram`` (down to ``min_ngram``) that occurs at all.
Several continuations give several children, and OPT-Tree (tree/builder.py) keeps the likeliest paths
by p̂ = the product of these frequencies. A context whose suffix never occurred gets q = 0
everywhere: the builder drafts nothing there, and the step emits only the target's own token.

The committed text is indexed once (n-gram -> counts of the next token), incrementally as it
grows; a tree node's context is the committed text followed by its root→node path, whose few
extra occurrences (those whose next token lies on the path) are counted on the fly.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from ..tree.draft_probs import DraftProbs
from ..tree.draft_tree import DraftTree
from .base import Drafter, ToProbs


class PromptLookupDrafter(Drafter):
    """A :class:`~opttree.drafters.base.Drafter` without a model.

    max_ngram / min_ngram: the longest / shortest suffix looked up (longest matching one wins).
    vocab_size: the length of the returned probability rows; :func:`make_drafter` fills it in from
    the target (pass a drafter built without it as ``draft_model=``).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: int | None = None):
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram!r}, "
                             f"max_ngram={max_ngram!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.vocab_size = vocab_size
        self.forwards = 0  # no model: no draft forwards, ever
        self.reset()

    def bind(self, target, to_probs: ToProbs | None) -> "PromptLookupDrafter":
        """A fresh drafter (empty index) with the target's vocabulary size: one per generate() call.
        (Its q are counted frequencies, not logits: sampling's warpers do not apply.)"""
        from ..hf.width import vocab_size

        return PromptLookupDrafter(self.max_ngram, self.min_ngram, vocab_size(target))

    def fresh(self) -> "PromptLookupDrafter":
        return PromptLookupDrafter(self.max_ngram, self.min_ngram, self.vocab_size)

    def reset(self) -> None:
        self.text: list[int] = []  # the committed tokens indexed so far
        self.device = torch.device("cpu")
        # counts[n][ngram] = Counter of the tokens that followed that n-gram in the committed text
        self.counts: dict[int, dict[tuple, Counter]] = {n: defaultdict(Counter)
                                                         for n in range(self.min_ngram, self.max_ngram + 1)}

    # -- indexing ---------------------------------------------------------------------------------

    def _index(self, sequence: list[int]) -> None:
        """Add the occurrences whose next token is new in ``sequence`` (which extends self.text)."""
        if sequence[:len(self.text)] != self.text:
            raise AssertionError("the committed sequence changed under the drafter; this is a bug")
        for j in range(max(len(self.text), 1), len(sequence)):  # j = index of the next token
            for n, table in self.counts.items():
                if j >= n:
                    table[tuple(sequence[j - n:j])][sequence[j]] += 1
        self.text = list(sequence)

    def _continuations(self, path: list[int]) -> Counter:
        """Counts of the tokens that followed the suffix of ``self.text + path``, longest n first."""
        context = self.text + path
        base = len(self.text)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) < n + 1:
                continue
            suffix = tuple(context[-n:])
            found = Counter(self.counts[n].get(suffix, ()))
            # occurrences whose next token is on the path (index j >= base), the suffix itself excluded
            for j in range(max(base, n), len(context)):
                if tuple(context[j - n:j]) == suffix:
                    found[context[j]] += 1
            if found:
                return found
        return Counter()

    def _probs(self, paths: list[list[int]]) -> DraftProbs:
        """Each path's empirical next-token frequencies, as per-row columns [k, J] (J: the most
        continuations any path has, at least 1; rows with fewer pad with token 0 at q = 0)."""
        if self.vocab_size is None:
            raise ValueError("PromptLookupDrafter needs vocab_size (make_drafter sets it from the target)")
        rows = []
        for path in paths:
            found = self._continuations(path)
            total = sum(found.values())
            rows.append([(t, c / total) for t, c in found.items() if t < self.vocab_size])
        width = max(1, max(len(r) for r in rows))
        ids = [[t for t, _ in r] + [0] * (width - len(r)) for r in rows]
        values = [[q for _, q in r] + [0.0] * (width - len(r)) for r in rows]
        return DraftProbs(torch.tensor(values, device=self.device), torch.tensor(ids, dtype=torch.long, device=self.device),
                          self.vocab_size)

    # -- the Drafter interface ---------------------------------------------------------------------

    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        """sequence: [T] long, the committed tokens -> [vocab] float."""
        self.device = sequence.device
        self._index(sequence.tolist())
        return self._probs([[]]).full()[0]

    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        """frontier: [k] long pool ids -> [k, vocab] float."""
        return self.expand_probs(pool, frontier).full()

    def expand_probs(self, pool: DraftTree, frontier: torch.Tensor) -> DraftProbs:
        """frontier: [k] long pool ids -> their continuations' frequencies, per-row columns."""
        tokens = pool.tokens.tolist()
        return self._probs([[tokens[i] for i in pool.path_to(int(f))] for f in frontier.tolist()])

    def commit(self, accepted_pool_ids: list[int]) -> None:
        """Nothing to drop: the next root_probs() indexes whatever was committed."""
