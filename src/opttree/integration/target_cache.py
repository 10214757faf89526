"""The target's cache for one generate() call: the one generate() made or was given, or a
``StaticCache`` opttree makes so that the verification compiles where generate() would compile plain
decoding (:func:`static_by_default`); and what the call needs of it (:func:`cache_need`: the slots it
may reach, which :func:`opttree.hf.tree_cache.check_cache` holds every cache of the call to)."""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache

from ..budget.policy import largest_tree
from ..hf.compat import GENERATE_CACHE_NAME, cache_from_generate
from ..hf.compiled import cache_slots, compiles_on_static
from ..hf.tree_cache import CacheNeed
from ..tree.config import TreeConfig
from ..tree.layout import MaskLayout
from ..tree.sizes import padded_size


def cache_need(input_ids: torch.Tensor, max_length: int, max_context: int | None, config: TreeConfig,
               generation_config) -> CacheNeed:
    """What a call of ``config`` needs of its caches: the slots it may reach (:func:`cache_room`), those
    plain decoding writes, its rows, the cache implementation asked for and the deepest tree."""
    return CacheNeed(room=cache_room(input_ids, max_length, max_context, config, largest_tree(config)),
                     plain=max_length - 1, rows=input_ids.shape[0],
                     implementation=generation_config.cache_implementation, depth=config.max_depth)


def target_cache(model, model_kwargs: dict, generation_config, need: CacheNeed, cache_given: bool):
    """(the target's cache, generate()'s model kwargs holding it): generate()'s own (its default
    ``DynamicCache`` where it made none: ``use_cache=False``), or where :func:`static_by_default`
    says so a ``StaticCache`` of :func:`~opttree.hf.compiled.cache_slots` slots, put in the kwargs
    in its place (the compiled path, where generate() would compile)."""
    cache = cache_from_generate(model_kwargs)
    cache = DynamicCache(config=model.config) if cache is None else cache
    if static_by_default(model, generation_config, cache_given, need.rows):
        cache = StaticCache(config=model.config, max_cache_len=cache_slots(need.room))
        model_kwargs = {**model_kwargs, GENERATE_CACHE_NAME: cache}
    return cache, model_kwargs


def static_by_default(model, generation_config, cache_given: bool, rows: int) -> bool:
    """Whether this call decodes on a static cache opttree makes, so that its verification compiles:
    the user named no cache (no ``cache_implementation=``, no cache object: ``cache_given``), one
    prompt, a model whose layers all attend fully, and generate() would compile plain decoding with a
    static cache (:func:`opttree.hf.compiled.compiles_on_static`: a GPU, or ``compile_config`` with
    ``_compile_all_devices``; not ``disable_compile=True``)."""
    if cache_given or generation_config.cache_implementation is not None or rows != 1:
        return False
    return not MaskLayout.of(model.config).windowed and compiles_on_static(model, generation_config)


def cache_room(input_ids: torch.Tensor, max_length: int, max_context: int | None, config: TreeConfig,
               max_nodes: int) -> int:
    """The most slots a cache may reach: the longest sequence plus one step's tree padded to its
    verification size; a batch also leaves holes (each step adds 1 + the most tokens any row accepted)."""
    if input_ids.shape[0] == 1:
        return min(max_length, max_context or max_length) + padded_size(max_nodes + 1)
    steps = max(max_length - input_ids.shape[1], 1)
    return input_ids.shape[1] + steps * (1 + min(max_nodes, config.max_depth)) + padded_size(max_nodes + 1)


__all__ = ["cache_need", "cache_room", "static_by_default", "target_cache"]
