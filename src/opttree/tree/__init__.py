"""Draft trees and how they grow: pure torch, no model and no transformers.

* :mod:`.draft_tree`: :class:`DraftTree`, tokens, parents, p̂ and ancestors as tensors, grown by whole layers;
* :mod:`.draft_probs`: ``DraftProbs``, a layer's draft q over the tokens the drafter can propose (and ``mix``);
* :mod:`.builder`: OPT-Tree (``build_opt_tree``) and ``BuiltTree``, a step's final tree;
* :mod:`.strategies`: every strategy behind one interface (``build_tree``: opt, heap, delayed, chain,
  static, sampled); :mod:`.sampled`: the tree drawn from the draft's q; :mod:`.static_trees`: fixed shapes;
* :mod:`.plan`: what one step's tree may be (``StepPlan``), asked of a ``BudgetPolicy``;
* :mod:`.config`: ``TreeConfig``, the user's tree settings;
* :mod:`.registry`: one record per strategy and per verifier (strategies.py and verify/walk.py register
  them), read by the validation, "auto", the dispatch and the docs;
* :mod:`.masks`: a tree as a model's inputs: 4D additive mask, rotary positions, cache slots;
* :mod:`.layout`: which keys each layer type sees (full, sliding window, chunk), read from the config
  as transformers reads it; one mask per type where they differ;
* :mod:`.sizes`: the few sizes a verification forward is padded to.

May import: nothing else of opttree (the ground floor; every other folder may import it).
"""

from . import strategies  # noqa: F401 - registers the strategies' records before any TreeConfig is checked
from .draft_tree import DraftTree

__all__ = ["DraftTree"]
