"""The contract (:mod:`.contract`) enforced: what a call asks that opttree cannot honour is refused by
name before any forward runs, and what generate() would drop before a ``custom_generate`` callable
is taken while the call's arguments are still whole.

Two moments:

- :func:`check_call`, inside the callable (every entry point): generate()'s prepared config, model
  kwargs and logits processors.
- :func:`~.contract.check_dropped_arguments` (written beside the refusals it reads, and handed on
  here) and :func:`stop_strings_criterion`, before generate() runs, in the one pre-check of every way
  in (:func:`.precheck.precheck`): generate() hands a callable neither ``tokenizer=`` nor
  ``assistant_model=`` nor ``synced_gpus=``, and runs ``cache_implementation="paged"`` without it.
"""

from __future__ import annotations

import copy

import torch

from .contract import (HONOURED, NO_DRAFT, NOT_APPLYING, REFUSED, check_dropped_arguments, check_positions, refused,
                       requested)

#: stock processors that keep state across calls (one call per generated token): tree nodes would corrupt it
STATEFUL_PROCESSORS = {
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config=",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale=",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale=",
}


def check_call(generation_config, model_kwargs: dict, logits_processor, input_ids: torch.Tensor) -> None:
    """Refuse, by name, any argument of this call that opttree cannot honour (:data:`.contract.REFUSED`
    whose values it checks itself, and model inputs the contract does not place)."""
    for name, refusal in REFUSED.items():
        if not refusal.checked_by and hasattr(generation_config, name):
            value = getattr(generation_config, name)
            if refusal.refuses(value):
                raise refused(name, value, refusal)
    check_model_kwargs(model_kwargs, input_ids)
    for processor in logits_processor or []:
        argument = STATEFUL_PROCESSORS.get(type(processor).__name__)
        if argument is not None:
            raise ValueError(f"{type(processor).__name__} (from {argument} or logits_processor=) keeps a state "
                             f"across its calls, one per generated token; opttree calls processors at tree nodes, "
                             f"which would corrupt it: {NO_DRAFT}")


def check_model_kwargs(model_kwargs: dict, input_ids: torch.Tensor) -> None:
    """The model inputs generate() prepared ([B, T] input_ids beside them): each must be honoured,
    not applying, or refused; any other is refused by name (the tree forward would not pass it)."""
    for name, value in model_kwargs.items():
        if value is None:
            continue
        if name in REFUSED:
            refusal = REFUSED[name]
            if not refusal.checked_by and refusal.refuses(value):
                raise refused(name, value, refusal)
        elif name not in HONOURED and name not in NOT_APPLYING:
            raise ValueError(f"{name}=: opttree's forwards do not pass this model input on, so the output could "
                             f"differ from generate()'s; drop it, or {NO_DRAFT}")
    check_positions(model_kwargs.get("position_ids"), model_kwargs.get("attention_mask"), input_ids)
    check_embeds(model_kwargs.get("inputs_embeds"), input_ids)


def check_embeds(inputs_embeds: torch.Tensor | None, input_ids: torch.Tensor) -> None:
    """inputs_embeds= is honoured next to the prompt's ids ([B, T, H] for input_ids [B, T])."""
    if inputs_embeds is None:
        return
    if input_ids.shape[1] == 0:
        raise ValueError("inputs_embeds= without input_ids=: opttree's draft proposes tokens from the prompt's ids; "
                         "pass input_ids= (the prompt's token ids) next to inputs_embeds=, or " + NO_DRAFT)
    if inputs_embeds.dim() != 3 or tuple(inputs_embeds.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(f"inputs_embeds= has shape {list(inputs_embeds.shape)} but input_ids= "
                         f"{list(input_ids.shape)}: pass one embedding per prompt token, [batch, length, hidden]")


# ---------------------------------------------------------------------------------------------
# before generate(): the stop-string criterion, made while the tokenizer is still there


def stop_strings_criterion(model, kwargs: dict) -> None:
    """``stop_strings=`` with ``tokenizer=``: generate() drops the tokenizer before a custom_generate
    callable and then cannot make the stop-string criterion ("could not locate a tokenizer"). Made here
    instead, in place: a StopStringCriteria appended to ``stopping_criteria=``, and generate() told
    ``stop_strings=None``. (Without a tokenizer, generate()'s own error asks for one.)"""
    from transformers import StoppingCriteriaList, StopStringCriteria

    strings, tokenizer = requested(model, kwargs, "stop_strings"), kwargs.get("tokenizer")
    if strings is None or tokenizer is None:
        return
    kwargs.pop("tokenizer")
    kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []),
                                                        StopStringCriteria(tokenizer=tokenizer, stop_strings=strings)])
    given = kwargs.get("generation_config")
    if given is not None and getattr(model.generation_config, "stop_strings", None) is None:
        given = copy.deepcopy(given)  # generate() warns about a generation_config next to its options
        given.stop_strings = None
        kwargs["generation_config"] = given
        kwargs.pop("stop_strings", None)
    else:
        kwargs["stop_strings"] = None


__all__ = ["STATEFUL_PROCESSORS", "check_call", "check_dropped_arguments", "check_embeds", "check_model_kwargs",
           "stop_strings_criterion"]
