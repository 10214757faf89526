"""The drafter interface: everything the decoding loop asks of a drafter, declared here.

A drafter proposes the draft distributions a tree is grown from. Per generate() call the loop
calls :meth:`Drafter.bind` once, then for every step :meth:`Drafter.root_probs` (catch up with the
committed text; the root's children), :meth:`Drafter.expand` once per tree layer, and
:meth:`Drafter.commit` with the accepted path. A drafter that reads the target's features says so
with :attr:`Drafter.wants_hidden_states` and gets them through :meth:`Drafter.features_from` and
:meth:`Drafter.add_features`. A batch of prompts is drafted through :meth:`Drafter.rows` (one
fresh drafter per row unless a drafter batches its rows itself, as the model drafter does).

To write your own, subclass :class:`Drafter` and implement the three abstract methods; every
other member has a default that is right for a model-free drafter with no per-call state::

    class Unigram(Drafter):
        def __init__(self, probs):            # probs: [vocab], the same guess everywhere
            self.probs = probs
        def root_probs(self, sequence):
            return self.probs.to(sequence.device)
        def expand(self, pool, frontier):
            return self.probs.to(pool.tokens.device).expand(len(frontier), -1)
        def commit(self, accepted_pool_ids):
            pass

    model.generate(ids, draft_model=Unigram(probs), nodes=8)
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Callable, Sequence

import torch

from ..tree.draft_probs import DraftProbs
from ..tree.draft_tree import DraftTree

ToProbs = Callable[[torch.Tensor], torch.Tensor]  # draft logits [k, vocab] float32 -> probabilities [k, vocab]


class Drafter(ABC):
    """Base class of every drafter (see the module docstring for the call order)."""

    forwards: int = 0
    """Draft forwards so far (a model's forward, or any call worth counting); the loop reports the
    difference per step. A model-free drafter leaves it 0."""

    wants_hidden_states: bool = False
    """True: the loop hands this drafter the target's features of every committed token
    (:meth:`features_from` of the target's hidden states, then :meth:`add_features`)."""

    context_length: int | None = None
    """The most tokens (prompt + new) this drafter can draft for; None: no limit of its own."""

    def bind(self, target, to_probs: ToProbs | None) -> "Drafter":
        """Called once per generate() call before anything else; returns the drafter the call uses.

        target: the model being decoded (vocabulary size, device, config).
        to_probs: with sampling, the draft logits -> probabilities the verifier will compare with
        the target's (generate()'s temperature/top-k/top-p warpers, then softmax); None for greedy
        decoding (a plain softmax is right). A drafter that makes its q from logits should use it.

        Default: ``self``, unchanged. A drafter with per-call state (a cache, an index of the text)
        should return a fresh copy here, so that one call's state never leaks into the next."""
        return self

    @abstractmethod
    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        """Catch up with the committed ``sequence`` ([T] long, ending with the root token) and
        return the draft's probabilities for the root's children: [vocab] float."""

    @abstractmethod
    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        """Probabilities for the children of ``pool`` nodes ``frontier`` ([k] long pool ids):
        [k, vocab] float. ``pool`` holds every node drafted this step (tokens, parents, p̂,
        ancestors); the frontier's nodes are new to the drafter."""

    @abstractmethod
    def commit(self, accepted_pool_ids: list[int]) -> None:
        """The root's accepted descendants (pool ids, root-to-leaf order) are now committed;
        forget every other node of this step."""

    def expand_probs(self, pool: DraftTree, frontier: torch.Tensor) -> DraftProbs:
        """What the decoding loop calls: :meth:`expand`'s q as a :class:`DraftProbs`. Default: the
        dense [k, vocab] rows. A drafter that can propose only some tokens (a feature head's kept
        tokens, prompt lookup's continuations) returns them alone, and the tree is grown from
        those columns, never spread over the vocabulary; its :meth:`expand` is then this
        method's ``full()``."""
        return DraftProbs.dense(self.expand(pool, frontier))

    def features_from(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The target's ``output_hidden_states`` of one row (each [1, T, H]) -> the features
        :meth:`add_features` takes, [T, F]. Default: the last hidden state (the output head's input).
        Called only when :attr:`wants_hidden_states`."""
        return hidden_states[-1][0]

    def add_features(self, features: torch.Tensor) -> None:
        """The target's features [m, F] of the next m committed tokens (the prompt's but its last,
        then each step's root and accepted tokens). Called only when :attr:`wants_hidden_states`."""
        raise NotImplementedError(f"{type(self).__name__} sets wants_hidden_states but has no add_features")

    def caches(self) -> list:
        """The transformers KV caches this drafter writes: the loop checks that they can hold the
        run (kv_cache.check_cache). Default: none."""
        return []

    def modules(self) -> list[torch.nn.Module]:
        """The torch modules whose forwards this drafter runs: decoding and calibration give their
        few-row CPU linears the kernels the target's get (``kernels.linears``). Default: none."""
        return []

    def compiled(self, compile_config, room: int) -> "Drafter":
        """This drafter with its forwards compiled as generate() compiles the target's decoding forward
        (``compile_config``: a ``transformers.CompileConfig``), for a call whose sequences reach at most
        ``room`` tokens. Called once per call, after :meth:`bind`, where opttree verifies through the
        compiled forward (a GPU by default). Default: ``self``, eager (a model drafter's forwards stay
        eager; a feature head drafts on fixed shapes, :mod:`opttree.drafters.head.graph`)."""
        return self

    def fresh(self) -> "Drafter":
        """A drafter like this one with none of its per-call state, for another batch row.
        Default: a deep copy (taken before the first step, when there is no state yet); a drafter
        that holds a model should share it instead (see ModelDrafter)."""
        return copy.deepcopy(self)

    def rows(self, count: int) -> "DrafterRows":
        """This drafter for ``count`` batch rows. Default: one drafter per row (this one and
        ``count - 1`` :meth:`fresh` ones), each drafting its own row."""
        return PerRow([self] + [self.fresh() for _ in range(count - 1)])


class DrafterRows(ABC):
    """A drafter over the rows of a batch: what the decoding loop talks to (batch 1 included)."""

    wants_hidden_states: bool = False

    @property
    @abstractmethod
    def forwards(self) -> int:
        """Draft forwards so far, over all rows (a forward shared by rows counts once)."""

    @abstractmethod
    def root_probs(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        """sequences: each row's committed tokens ([T_b] long, no padding) -> each row's [vocab]."""

    @abstractmethod
    def expand(self, requests: list) -> list:
        """requests: per row ``(pool, frontier)`` or None (a row not expanding this round) -> per
        row its children's q (a :class:`DraftProbs`, k_b rows), or None."""

    @abstractmethod
    def commit(self, accepted: list[list[int]]) -> None:
        """accepted: per row the accepted pool ids, root to leaf."""

    @abstractmethod
    def select(self, keep: list[int]) -> None:
        """Only rows ``keep`` (ascending indices into the current rows) go on."""

    def features_from(self, row: int, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """Row ``row``'s features from the target's hidden states of that row (each [1, T, H])."""
        raise NotImplementedError

    def add_features(self, features: list[torch.Tensor]) -> None:
        """Per row, the target's features [m_b, F] of its next committed tokens."""
        raise NotImplementedError

    def caches(self) -> list:
        """The KV caches this drafter writes (checked before decoding: they must hold the run)."""
        return []


class PerRow(DrafterRows):
    """The default batch view: one drafter per row, each drafting its own row with one call per
    row and layer (at batch size 1, the drafter itself with a list around it)."""

    def __init__(self, drafters: list[Drafter]):
        self.drafters = drafters
        self.wants_hidden_states = drafters[0].wants_hidden_states
        self._gone = 0  # forwards of the rows that have left

    @property
    def forwards(self) -> int:
        return self._gone + sum(d.forwards for d in self.drafters)

    def root_probs(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        return [d.root_probs(seq) for d, seq in zip(self.drafters, sequences)]

    def expand(self, requests: list) -> list:
        return [None if r is None else d.expand_probs(*r) for d, r in zip(self.drafters, requests)]

    def commit(self, accepted: list[list[int]]) -> None:
        for d, ids in zip(self.drafters, accepted):
            d.commit(ids)

    def select(self, keep: list[int]) -> None:
        kept = set(keep)
        self._gone += sum(d.forwards for b, d in enumerate(self.drafters) if b not in kept)
        self.drafters = [self.drafters[b] for b in keep]

    def features_from(self, row: int, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.drafters[row].features_from(hidden_states)

    def add_features(self, features: list[torch.Tensor]) -> None:
        for d, f in zip(self.drafters, features):
            d.add_features(f)

    def caches(self) -> list:
        return [c for d in self.drafters for c in d.caches()]


__all__ = ["Drafter", "DrafterRows", "PerRow", "ToProbs"]
