"""A prepared generate() call run (:func:`decode`): the decoding loop (:func:`opttree.loop.generation.speculative_decode`)
under opttree's CPU kernels, the target's cache closed back as plain leaves it, and generate()'s output."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..hf import kv_cache
from ..hf.compat import output_cache
from ..kernels.linears import fast_linears
from ..loop.generation import speculative_decode
from ..loop.stats import GenerationStats
from .prepare import DecodeCall


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """generate()'s usual output (``return_dict_in_generate=True``) plus opttree's ``stats``."""

    stats: GenerationStats | None = None


def decode(call: DecodeCall):
    """Run a prepared call: the loop, then the target's cache closed back as plain leaves it (also when
    the loop fails), then generate()'s output."""
    settings, cache = call.settings, call.cache
    if call.stream_prompt:
        settings.streamer.put(call.input_ids.cpu())
    result = None
    try:
        with torch.inference_mode(), fast_linears(*call.kernels, on=bool(call.kernels)):
            result = speculative_decode(call.model, call.drafters, call.input_ids, cache.cache, settings,
                                        attention_mask=call.attention_mask, model_inputs=call.model_inputs)
    finally:
        one = result is not None and result.sequences.shape[0] == 1
        # one row: plain's cache holds the sequence but its last token; a batch's (and a failed call's) as it is
        cache.close(result.sequences.shape[1] - 1 if one else kv_cache.cache_length(cache.cache), writable=True)
    if call.return_dict:  # a batch's cache has lost its finished rows: not returned
        return SpeculativeDecoderOnlyOutput(
            sequences=result.sequences, scores=result.scores, logits=result.logits,
            stats=result.stats, **output_cache(cache.cache if call.input_ids.shape[0] == 1 else None),
        )
    return result.sequences


__all__ = ["SpeculativeDecoderOnlyOutput", "decode"]
