"""The interface every head declares: what the head drafters (:mod:`opttree.drafters.head.drafter`,
:func:`opttree.drafters.head.graph.head_step`) and the loading ask of a one-layer draft head that reads the
target's features (opttree's own :class:`~opttree.drafters.head.feature_head.FeatureHead`, and the
published EAGLE layouts of :mod:`.eagle`).

A head has *entries*: entry ``e`` reads the embedding of token ``e + first_entry`` and a *fed
feature* of width ``c.hidden_size`` (the target's, fused by :meth:`DraftHead.target_features`, or
the head's own output for a tree node), sits at rotary position ``e`` and returns the fed feature of
the next entry. Its logits are ``linear(logit_input(fed), output_rows(), out_bias)`` over the
columns ``token_ids`` (target ids), spread over the target's vocabulary where a dense q is needed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from ...kernels import linears
from .layer import KV


class DraftHead(nn.Module, ABC):
    """Base class of the heads (see the module docstring)."""

    c: object
    """The head's shapes: ``hidden_size`` (h, the fed width), ``num_heads``, ``num_kv_heads``,
    ``head_dim``, ``num_layers`` (decoder layers: the KV buffers' depth), ``vocab_size`` (the target's V)."""
    token_ids: torch.Tensor
    """[K] long buffer: the target id of each output column."""
    out_bias: torch.Tensor
    """[K]: the output bias (a parameter or a buffer)."""

    first_entry: int = 0
    """0: an entry per token, the first reading a zero feature (opttree's head); 1: none for the
    first token, entry e pairs token e + 1 with feature e (EAGLE)."""

    @abstractmethod
    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, past: KV | None,
                mask: torch.Tensor, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """features [b, q, h] (fed), tokens [b, q], positions [b, q], mask [b, 1, q, n] additive ->
        (the next fed features [b, q, h], the new entries' KV). ``slots`` None: ``past`` holds the s
        entries before these, or None (n = s + q; training); ``slots`` [q] long: ``past`` is the
        drafters' cache of fixed size [1, layers * kv_heads, S, d], written in place at ``slots``
        and attended over its first n (:func:`opttree.drafters.head.graph.head_step`)."""

    @abstractmethod
    def target_features(self, hidden_states) -> torch.Tensor:
        """The target's ``output_hidden_states`` (each [b, T, H]) -> the fed features [b, T, h]."""

    @abstractmethod
    def logit_input(self, fed: torch.Tensor) -> torch.Tensor:
        """Fed features [..., h] -> what the output rows read [..., h]."""

    @abstractmethod
    def output_rows(self) -> torch.Tensor:
        """[K, h]: the output rows, one per column of ``token_ids``."""

    @abstractmethod
    def check_fits(self, target) -> None:
        """ValueError naming the mismatch when ``target`` is not a model this head drafts for."""

    @abstractmethod
    def shared_with_target(self) -> list:
        """The target's own modules/tensors this head reads (never copied with the head)."""

    @property
    def device(self) -> torch.device:
        return self.token_ids.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the head computes in (its first parameter's)."""
        return next(self.parameters()).dtype

    def reduced_logits(self, fed: torch.Tensor) -> torch.Tensor:
        """Fed features [..., h] -> logits over the K columns [..., K]."""
        x = self.logit_input(fed)
        weight = self.output_rows()
        weight = weight if weight.dtype == x.dtype else weight.to(x.dtype)
        return linears.linear(x, weight, self.out_bias.to(x.dtype))  # the few-row kernels the layers get

    def full_logits(self, fed: torch.Tensor) -> torch.Tensor:
        """[..., h] -> [..., V] float32; tokens outside the columns get finfo.min."""
        return self.spread(self.reduced_logits(fed))

    def spread(self, small: torch.Tensor) -> torch.Tensor:
        """Logits over the columns [..., K] -> over the vocabulary [..., V] float32 (finfo.min elsewhere)."""
        small = small.float()
        full = small.new_full((*small.shape[:-1], self.c.vocab_size), torch.finfo(torch.float32).min)
        return full.index_copy_(-1, self.token_ids, small)

    def for_target(self, target):
        """A fresh drafter for one generate() call on ``target`` (checked to fit this head)."""
        from .drafter import FeatureHeadDrafter

        return FeatureHeadDrafter(self).bind(target, None)


__all__ = ["DraftHead"]
