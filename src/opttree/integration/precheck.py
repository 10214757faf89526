"""The one pre-check sequence of every way in, run on the call's own arguments before generate()
prepares anything (:func:`precheck`); what it returns, :class:`~.prepare.Options`, is all a way in
hands the decode besides generate()'s own preparation.

Every way in calls it once: ``speculative()``'s generate, :class:`~opttree.SpeculativeGenerator` and the
Hub folder (``hub_generate``) on the keyword arguments they were given, and
``custom_generate=speculative_generate`` on what generate() was called with
(:func:`opttree.hf.generate_call.dropped_by_generate`: generate() hands a callable neither the streamer
nor ``assistant_model=``/``synced_gpus=``). ``tests/test_precheck.py`` holds that each way in refuses the
same bad inputs with the same error.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..hf.compat import cache_passed
from .arguments import check_dropped_arguments, stop_strings_criterion
from .defaults import TreeArguments
from .prepare import Options

NEEDS_DRAFT = ("speculative generation needs draft_model=<a small causal LM with the target's vocabulary, a draft "
               "folder, or 'prompt_lookup'>")
NOT_BOTH = ("draft_model= runs opttree through generate()'s custom_generate hook; pass draft_model= or "
            "custom_generate=, not both")


def precheck(model, draft_model, generator: torch.Generator | None, kwargs: dict, *,
             under: TreeArguments | None = None, ours: Callable | None = None,
             prompt_streamed: bool = False) -> Options:
    """Check one call's arguments, in this order, and take opttree's own out of ``kwargs`` (in place):

    1. ``draft_model=`` is given;
    2. the tree arguments (``nodes=``, ``threshold=``, ...) are taken out and checked, over ``under``'s
       (a SpeculativeGenerator's constructor's);
    3. a ``custom_generate=`` other than ``ours`` (opttree's own callable) is refused next to a draft;
    4. what generate() would drop before a custom_generate callable, or route around it, is refused by
       name (:func:`~.contract.check_dropped_arguments`: ``assistant_model=``, ``synced_gpus=``,
       ``token_healing=``, a paged or offloaded cache implementation);
    5. ``stop_strings=`` with ``tokenizer=`` becomes a stopping criterion (generate() drops the tokenizer);
    6. the streamer is taken out, and whether a cache object was passed is noted.

    ``prompt_streamed``: generate() has already put the prompt into the streamer (the callable way in).
    """
    if draft_model is None:
        raise ValueError(NEEDS_DRAFT)
    tree = TreeArguments.taken_from(kwargs, under=under)
    custom = kwargs.pop("custom_generate", None)
    if custom is not None and custom is not ours:
        raise ValueError(NOT_BOTH)
    check_dropped_arguments(model, kwargs)
    stop_strings_criterion(model, kwargs)
    streamer = kwargs.pop("streamer", None)
    return Options(draft_model, tree, streamer, generator, prompt_streamed=prompt_streamed and streamer is not None,
                   cache_given=cache_passed(kwargs))


__all__ = ["NEEDS_DRAFT", "NOT_BOTH", "precheck"]
