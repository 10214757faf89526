"""One generate() call made ready to decode: everything opttree can check is checked, in one place,
before any forward runs (the calibration of ``nodes="auto"`` is the only forward here, and it runs
after every check), and the result is one value, :class:`DecodeCall`, that
:func:`opttree.integration.decoding.decode` runs.

Each way in (``speculative()``'s generate, :class:`~opttree.SpeculativeGenerator`,
``custom_generate=speculative_generate``) reaches :func:`prepare` from inside generate()'s
``custom_generate`` hook, with generate()'s own preparation (:class:`GenerateCall`) and opttree's
arguments (:class:`Options`); what generate() drops before the hook is checked earlier, by the one
pre-check every way in runs on the call's arguments (:mod:`.precheck`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import CompileConfig

from ..budget import calibration
from ..drafters import make_drafter
from ..drafters.base import DrafterRows
from ..hf.compiled import VerifyForward
from ..hf.tree_cache import TreeCache, check_cache, decoding_slots, open_cache
from ..hf.validation import check_generation_mode, check_inputs, check_weights, context_length
from ..loading import prepare_draft
from ..loop.settings import DecodeSettings
from ..loop.model_inputs import ModelInputs
from ..loop.rows import Padding
from ..tree.layout import MaskLayout
from ..verify.sampling import draft_to_probs
from .arguments import check_call
from .defaults import TreeArguments, resolve
from .target_cache import cache_need, target_cache


@dataclass(frozen=True)
class GenerateCall:
    """What generate() hands a ``custom_generate`` callable: its own preparation of the call."""

    input_ids: torch.Tensor  # [B, T]
    logits_processor: object  # generate()'s LogitsProcessorList
    stopping_criteria: object  # generate()'s StoppingCriteriaList (max length and EOS included)
    generation_config: object
    model_kwargs: dict  # attention_mask, the cache generate() made or was given, inputs_embeds, ...


@dataclass(frozen=True)
class Options:
    """opttree's own arguments of the call."""

    draft_model: object  # anything draft_model= takes
    tree: TreeArguments
    streamer: object | None = None
    generator: torch.Generator | None = None
    prompt_streamed: bool = False  # generate() has already put the prompt into ``streamer``
    cache_given: bool = False  # the user passed a cache object (generate() did not make it)


@dataclass
class DecodeCall:
    """A call ready to decode (see the module docstring)."""

    model: object
    drafters: DrafterRows
    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor | None
    cache: TreeCache  # the target's, opened for trees (closed by the decode)
    settings: DecodeSettings
    model_inputs: ModelInputs | None
    kernels: list[torch.nn.Module]  # the modules whose few-row linears run through opttree's CPU kernels
    return_dict: bool  # generate()'s return_dict_in_generate
    stream_prompt: bool  # the decode puts the prompt into the streamer first


def prepare(model, call: GenerateCall, options: Options) -> DecodeCall:
    """Check everything, calibrate ``"auto"`` if asked, and open the target's cache (see the module docstring)."""
    config_in, kwargs = call.generation_config, call.model_kwargs
    input_ids = call.input_ids.long()  # generate()'s output is long whatever the prompt's dtype
    check_generation_mode(config_in)
    check_call(config_in, kwargs, call.logits_processor, input_ids)  # the contract's refusals (contract.py)
    check_weights(model, "target")
    MaskLayout.of(model.config)  # layer types opttree cannot mask are refused by name
    rows = input_ids.shape[0]
    if options.streamer is not None and rows > 1:
        raise ValueError("streamers take one sequence (generate()'s rule): stream one prompt per generate() call")
    attention_mask = kwargs.get("attention_mask")
    draft = prepare_draft(options.draft_model, model)  # a draft folder: loaded once for this call
    sampling = bool(config_in.do_sample)
    to_probs = draft_to_probs(call.logits_processor) if sampling else None  # the tree sees the q the verifier sees
    drafter = make_drafter(draft, model, to_probs)
    max_context = context_length(model)
    if drafter.context_length is not None:
        max_context = min(max_context or drafter.context_length, drafter.context_length)
    check_inputs(input_ids, attention_mask, max_context)
    if attention_mask is not None:
        Padding.of(attention_mask)  # a masked last prompt token is refused now, not at the first step
    config = resolve(options.tree, can_calibrate=calibration.prefix_within(max_context) is not None)
    max_length = call.stopping_criteria.max_length or config_in.max_length
    need = cache_need(input_ids, max_length, max_context, config, config_in)
    cache, kwargs = target_cache(model, kwargs, config_in, need, options.cache_given)
    verify = VerifyForward.of(model, kwargs, config_in)  # compiled where generate() would compile
    if verify.compiles:  # the draft's forwards too, where it can (a feature head: fixed shapes)
        drafter = drafter.compiled(config_in.compile_config or CompileConfig(), need.room)
    drafters = drafter.rows(rows)
    for each in [cache, *drafters.caches()]:
        check_cache(each, need)
    # few-row CPU linears' kernels (kernels.linears); a compiled target's linears are the compiler's, and a compiled
    # drafter has none (Drafter.modules)
    kernels = [m for m in [model, *drafter.modules()] if not (verify.compiles and m is model)]
    # nodes/threshold="auto": measure this machine (a scratch drafter of the same kind is timed): the only
    # forwards before decoding, after every check; timed as decoding runs (its forward, its kernels)
    policy = calibration.policy_maker(config, model, drafter, drafter.fresh, forward=verify, sampling=sampling,
                                      kernels=kernels, slots=decoding_slots(cache, need))
    opened = open_cache(cache, need)
    settings = DecodeSettings.of(config, config_in, call.logits_processor, call.stopping_criteria,
                                 max_length=max_length, context_length=max_context, streamer=options.streamer,
                                 generator=options.generator, new_policy=policy, verify_forward=verify)
    return DecodeCall(model, drafters, input_ids, attention_mask, opened, settings, ModelInputs.of(kwargs), kernels,
                      return_dict=bool(config_in.return_dict_in_generate),
                      stream_prompt=options.streamer is not None and not options.prompt_streamed)


__all__ = ["DecodeCall", "GenerateCall", "Options", "prepare"]
