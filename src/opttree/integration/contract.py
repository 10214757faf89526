"""generate()'s whole contract with a draft: every argument plain ``generate()`` takes is in exactly
one of three sets.

- :data:`HONOURED`: opttree's output is plain's with it (greedy: token for token, up to a near-tie of
  plain's own top scores within the dtype's rounding; sampled: plain's own law).
- :data:`REFUSED`: a value opttree cannot honour is refused by name, before any forward runs, with
  what to do instead (``Refusal.refuses`` says which values; its other values, the defaults among
  them, change nothing opttree cannot reproduce).
- :data:`NOT_APPLYING`: it changes nothing in plain generate()'s greedy or sampled decoding of a
  decoder-only model (beam-search and assisted-generation options, metadata), so there is nothing
  to honour.

:data:`ADDED` holds the arguments opttree adds to generate(). ``opttree arguments`` prints all four as
the page ``docs/arguments.md`` (:mod:`.contract_page`).

The names: :func:`generate_arguments` takes ``GenerationConfig``'s fields and a model's own inputs (its
declared signatures) from transformers, and declares what generate() takes itself (its parameters, the
keywords its body pops, those its decorators rename, the model kwargs it always lets through: nothing
here reads transformers' source). ``tests/test_contract.py`` reads the installed transformers' source and
fails where it and these declarations part, and fails on any name in none of the sets or in two, so a
transformers release that adds an argument fails until it is placed.

:mod:`.arguments` enforces the refusals a value decides. A refusal that needs more than its value names
the functions that check it (``Refusal.checked_by``): :func:`check_dropped_arguments` and
:func:`check_positions` here, beside the table they read, for what generate() would drop before a
``custom_generate`` callable and for positions; :mod:`opttree.hf` for the generation mode and the cache.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import GenerationConfig

from ..hf.compat import GENERATE_CACHE_NAME, NEW_CACHE_NAME
from ..hf.tree_cache import IMPLEMENTATION_FIX, OBJECT_FIX, check_cache, implementation_refused
from ..hf.validation import check_generation_mode
from ..tree import registry
from ..verify import walk  # noqa: F401 - registers the verifiers' records, listed in ADDED below

__all__ = ["ADDED", "HONOURED", "NOT_APPLYING", "REFUSED", "Refusal", "check_dropped_arguments", "check_positions",
           "generate_arguments", "placement", "refused", "unplaced"]


def _given(value) -> bool:
    """Any value but generate()'s "not given" (None, False)."""
    return value is not None and value is not False


@dataclass(frozen=True)
class Refusal:
    fix: str  # what to do instead (the error reads "<name>=<value>: <fix>")
    refuses: Callable[[object], bool] = _given  # which values are refused
    checked_by: tuple[Callable, ...] = ()  # the functions that check it when that needs more than the value itself
    example: object = None  # a refused value (tests pass it to generate()); None: tested by checked_by's tests


def _short(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {list(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def refused(name: str, value, refusal: Refusal) -> ValueError:
    """The error that refuses ``name=value``, naming the fix."""
    return ValueError(f"{name}={_short(value)}: {refusal.fix}")


# ---------------------------------------------------------------------------------------------
# the checks of refusals that read more than their value (REFUSED names them)


def requested(model, kwargs: dict, name: str):
    """The value of generation option ``name`` a call to ``model.generate(**kwargs)`` runs with:
    its keyword, else its generation_config='s, else the model's own generation_config's."""
    if kwargs.get(name) is not None:
        return kwargs[name]
    given = kwargs.get("generation_config")
    if given is not None and getattr(given, name, None) is not None:
        return getattr(given, name)
    return getattr(model.generation_config, name, None)


def check_dropped_arguments(model, kwargs: dict) -> None:
    """Before generate() runs: refuse what it would silently drop or route around a custom_generate callable."""
    for name in ("assistant_model", "synced_gpus"):
        if REFUSED[name].refuses(kwargs.get(name)):
            raise refused(name, kwargs[name], REFUSED[name])
    if requested(model, kwargs, "token_healing"):
        raise refused("token_healing", True, REFUSED["token_healing"])
    implementation = requested(model, kwargs, "cache_implementation")  # before generate() builds the cache
    if REFUSED["cache_implementation"].refuses(implementation):  # ("paged": it would hand it to generate_batch())
        raise refused("cache_implementation", implementation, REFUSED["cache_implementation"])


def default_positions(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] long: the positions generate() derives when none are given (padding at 0)."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand(input_ids.shape[0], -1)
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def check_positions(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                    input_ids: torch.Tensor) -> None:
    """generate() fills position_ids from the mask when none are given; other ones are refused."""
    if position_ids is None or input_ids.shape[1] == 0:
        return
    expected = default_positions(attention_mask, input_ids).to(position_ids.device)
    if position_ids.shape != expected.shape or not torch.equal(position_ids.long(), expected):
        raise refused("position_ids", position_ids, REFUSED["position_ids"])


# ---------------------------------------------------------------------------------------------
# the arguments opttree adds, and the three sets


ADDED: dict[str, str] = {
    "draft_model": "what drafts: a small causal LM with the target's vocabulary, a draft folder (loaded with "
                   "load_draft: `opttree distill`'s, or a published EAGLE-3 / speculators / EAGLE-1/2 head's) or its "
                   "Hub name, \"prompt_lookup\" (n-grams of the text itself), or a Drafter; without it generate() "
                   "is stock",
    "nodes": "the tree's node budget: each step keeps the nodes of highest path probability p̂ (the root not "
             "counted; 1 to 1024); \"auto\": the tree that maximises expected tokens per second, from this "
             "target's and this draft's latencies timed on this machine",
    "threshold": "δ: the tree grows one more layer while that raises E(A) = Σp̂ by more than δ; \"auto\": with "
                 "nodes=\"auto\", a layer is drafted while its expected gain per second beats the current rate",
    "max_depth": "the deepest layer ever drafted",
    "strategy": f"how the tree grows: {registry.listing(registry.STRATEGIES.values())}",  # the records' words
    "verifier": f"how the target accepts drafted tokens: {registry.listing(registry.VERIFIERS.values())}; all lossless",
    "static_tree": "for strategy=\"static\": the tree as root-to-node paths of sibling ranks, e.g. "
                   "((0,), (1,), (0, 0)); EAGLE- and Sequoia-style trees in opttree.tree.static_trees",
    "generator": "a torch.Generator that seeds sampling, for reproducible draws",
}
# With neither nodes nor threshold, generate() runs nodes="auto", threshold="auto" where it can; an argument
# left out next to one given takes TreeConfig's default (integration/defaults.py).

BEAM_ONLY = "a beam-search option: it takes effect only with num_beams > 1, which opttree refuses by name"
ASSISTED_ONLY = ("an option of HF's assisted generation: it takes effect only with assistant_model= (or "
                 "prompt_lookup_num_tokens=), which opttree refuses next to draft_model=")
NO_DRAFT = "call generate() without draft_model= for it"

HONOURED: dict[str, str] = {
    # the prompt
    "inputs": "the prompt's token ids (generate()'s first argument)",
    "input_ids": "the prompt's token ids",
    "attention_mask": "left padding of a batch (rows' positions and masks as generate() derives them)",
    "inputs_embeds": "next to input_ids=: the prompt's KV and its last position from the embeddings, every new token "
                     "by id, as generate() (loop/model_inputs.py); alone it is refused (see arguments.py)",
    "token_type_ids": "the prompt's, then each row's last value repeated for every new token, as generate()",
    # length and stopping
    "max_length": "MaxLengthCriteria, decided on the host",
    "max_new_tokens": "MaxLengthCriteria, decided on the host",
    "min_length": "MinLengthLogitsProcessor at every node",
    "min_new_tokens": "MinNewTokensLengthLogitsProcessor at every node",
    "max_time": "MaxTimeCriteria, asked token by token",
    "stop_strings": "StopStringCriteria with tokenizer=, on every entry point that sees the call's arguments "
                    "(generate() drops tokenizer= before a custom_generate callable)",
    "tokenizer": "builds stop_strings' criterion",
    "eos_token_id": "EosTokenCriteria: EOS inside an accepted path ends the row where plain does",
    "pad_token_id": "finished rows padded as generate() pads them",
    "bos_token_id": "generate()'s own use (a prompt made from it)",
    "stopping_criteria": "asked token by token on each row's context",
    # decoding
    "do_sample": "greedy walk or the exact sampling verifiers",
    "temperature": "a warper at every node, and on the draft's q",
    "top_k": "a warper at every node, and on the draft's q",
    "top_p": "a warper at every node, and on the draft's q",
    "min_p": "a warper at every node, and on the draft's q",
    "top_h": "a warper at every node",
    "typical_p": "a warper at every node, and on the draft's q",
    "epsilon_cutoff": "a warper at every node, and on the draft's q",
    "eta_cutoff": "a warper at every node, and on the draft's q",
    "repetition_penalty": "a processor at every node, each row with its own prompt_ignore_length (batch context)",
    "encoder_repetition_penalty": "a processor at every node, each row with its own prompt (batch context)",
    "encoder_no_repeat_ngram_size": "a processor at every node, each row with its own prompt (batch context)",
    "no_repeat_ngram_size": "a processor at every node",
    "bad_words_ids": "a processor at every node",
    "sequence_bias": "a processor at every node",
    "renormalize_logits": "a processor at every node",
    "forced_bos_token_id": "a processor at every node",
    "forced_eos_token_id": "a processor at every node",
    "remove_invalid_values": "a processor at every node",
    "exponential_decay_length_penalty": "a processor at every node",
    "suppress_tokens": "a processor at every node",
    "begin_suppress_tokens": "a processor at every node",
    "logits_processor": "at every node on the row's context; a processor with batch state sees row b at index b "
                        "(loop/batch_context.py); stateful stock ones are refused (arguments.py)",
    "prefix_allowed_tokens_fn": "called with each row's own batch index and context (loop/batch_context.py)",
    "num_return_sequences": "with do_sample=True: each sequence is a row of the batch (greedy: refused by "
                            "check_generation_mode)",
    # outputs
    "return_dict_in_generate": "SpeculativeDecoderOnlyOutput, with .stats",
    "output_scores": "generate()'s per-token [batch, vocab] scores",
    "output_logits": "generate()'s per-token [batch, vocab] logits",
    "streamer": "the prompt, every accepted token, end(); one prompt, as generate()",
    # speed only: the same tokens
    "compile_config": "where generate() would compile plain decoding (a static cache on a device it compiles for), "
                      "opttree's verification forward runs through the same compiled callable (hf/compiled.py)",
    "disable_compile": "no compiled verification forward, as generate() compiles none (hf/compiled.py)",
    # the call
    "generation_config": "generate()'s own preparation reads it",
    "custom_generate": "the hook opttree runs through (another callable next to draft_model= is refused)",
}

NOT_APPLYING: dict[str, str] = {
    "_from_model_config": "GenerationConfig metadata",
    "transformers_version": "GenerationConfig metadata",
    "early_stopping": BEAM_ONLY,
    "length_penalty": BEAM_ONLY,
    "num_beam_groups": BEAM_ONLY,
    "diversity_penalty": BEAM_ONLY,
    "low_memory": "a memory option of beam and contrastive search",
    "use_cache": "plain decoding without a cache gives the same tokens; opttree's tree verification needs its cache",
    "cache_config": "configures the cache cache_implementation= asks for (checked there)",
    "max_cache_len": "sizes the cache cache_implementation= asks for (checked there)",
    "continuous_batching_config": "only with cache_implementation='paged', which is refused",
    "decoder_start_token_id": "encoder-decoder models only (refused as targets and drafts)",
    "is_assistant": "set by HF on an assistant model's own config",
    "num_assistant_tokens": ASSISTED_ONLY,
    "num_assistant_tokens_schedule": ASSISTED_ONLY,
    "assistant_confidence_threshold": ASSISTED_ONLY,
    "assistant_lookbehind": ASSISTED_ONLY,
    "target_lookbehind": ASSISTED_ONLY,
    "max_matching_ngram_size": ASSISTED_ONLY,
    "assistant_ensemble_weight": ASSISTED_ONLY,
    "speculation_type": ASSISTED_ONLY,
    "assistant_tokenizer": ASSISTED_ONLY,
    "negative_prompt_ids": "only with guidance_scale=, which is refused",
    "negative_prompt_attention_mask": "only with guidance_scale=, which is refused",
    "trust_remote_code": "loads a Hub decoding method (custom_generate='<repo>'); opttree's own is hub/",
    "labels": "a training target: plain computes a loss it discards, the tokens are the same",
    "logits_to_keep": "generate()'s own setting for its forwards; opttree asks for the logits each forward needs",
    "output_router_logits": "a mixture-of-experts model's auxiliary output; plain discards it, the tokens are the same",
}

PACKED = ("a packed-sequence attention input (training with flash attention); opttree's forwards build "
          "their own tree masks: drop it")
INTERNAL = "generate()'s own bookkeeping between its forwards, not an argument: drop it"

REFUSED: dict[str, Refusal] = {
    "num_beams": Refusal("opttree decodes one sequence per prompt; pass num_beams=1, or drop draft_model=",
                         lambda v: v is not None and v > 1, (check_generation_mode,), 2),
    "penalty_alpha": Refusal("contrastive search; drop it, or " + NO_DRAFT,
                             lambda v: v is not None and v > 0, (check_generation_mode,), 0.6),
    "dola_layers": Refusal("DoLa decoding; drop it, or " + NO_DRAFT, _given,
                           (check_generation_mode,), "high"),
    "constraints": Refusal("constrained beam search; drop it, or " + NO_DRAFT, _given,
                           (check_generation_mode,)),
    "force_words_ids": Refusal("constrained beam search; drop it, or " + NO_DRAFT, _given,
                               (check_generation_mode,), [[5]]),
    "prompt_lookup_num_tokens": Refusal("HF's prompt lookup; opttree's is draft_model='prompt_lookup'", _given,
                                        (check_generation_mode,), 3),
    "assistant_early_exit": Refusal("HF's self-speculation; pass one speculative method", _given,
                                    (check_generation_mode,), 1),
    "use_mtp": Refusal("HF's multi-token-prediction speculation; pass one speculative method", _given,
                       (check_generation_mode,), True),
    "assistant_model": Refusal("draft_model= and assistant_model= are two speculative methods; pass one (opttree takes "
                               "the assistant itself as draft_model=)", _given, (check_dropped_arguments,)),
    "guidance_scale": Refusal(
        "classifier-free guidance runs a second, stateful forward per token that tree nodes would corrupt; "
        + NO_DRAFT, lambda v: v is not None and v != 1, example=1.5),
    "watermarking_config": Refusal(
        "SynthID watermarking keeps a per-token state that tree nodes would corrupt (WatermarkingConfig is "
        "honoured); " + NO_DRAFT, lambda v: type(v).__name__ == "SynthIDTextWatermarkingConfig"),
    "token_healing": Refusal(
        "generate() drops tokenizer= before a custom_generate callable; heal the prompt first "
        "(ids = model.heal_tokens(ids, tokenizer=tok)) and generate from it with draft_model=",
        checked_by=(check_dropped_arguments,)),
    "prefill_chunk_size": Refusal("opttree prefills the prompt in one forward; drop it, or " + NO_DRAFT, example=2),
    "output_attentions": Refusal(
        "opttree's verification forward scores a whole tree, so per-token attentions are not generate()'s; "
        + NO_DRAFT, example=True),
    "output_hidden_states": Refusal(
        "opttree's verification forward scores a whole tree, so per-token hidden states are not generate()'s; "
        + NO_DRAFT, example=True),
    "cache_implementation": Refusal(
        IMPLEMENTATION_FIX, implementation_refused,
        (check_dropped_arguments, check_cache),  # by value, before generate() builds the cache; by the cache it built
        "offloaded_static"),
    "cache": Refusal("an offloaded, quantized or filled cache, or a StaticCache too small for the call; "
                     + OBJECT_FIX, _given, (check_cache,)),
    "past_key_values": Refusal("an offloaded, quantized or filled cache, or a StaticCache too small for the call; "
                               + OBJECT_FIX, _given, (check_cache,)),
    "cache_params": Refusal("an offloaded, quantized or filled cache, or a StaticCache too small for the call; "
                            + OBJECT_FIX, _given, (check_cache,)),  # generate() renames it cache=
    "position_ids": Refusal(
        "opttree places every token by the attention mask, as generate() does by default; drop position_ids=",
        checked_by=(check_positions,)),
    "synced_gpus": Refusal("opttree's forwards are not kept in step across processes; " + NO_DRAFT,
                           checked_by=(check_dropped_arguments,)),
    "encoder_hidden_states": Refusal("cross-attention inputs are not passed to opttree's tree forward; " + NO_DRAFT),
    "encoder_attention_mask": Refusal("cross-attention inputs are not passed to opttree's tree forward; " + NO_DRAFT),
    "is_first_iteration": Refusal(INTERNAL, example=True),
    "next_sequence_length": Refusal(INTERNAL, example=1),
    "cu_seq_lens_q": Refusal(PACKED),
    "cu_seq_lens_k": Refusal(PACKED),
    "max_length_q": Refusal(PACKED, example=6),
    "max_length_k": Refusal(PACKED, example=6),
    "seq_idx": Refusal(PACKED),
    "is_causal": Refusal(PACKED, example=True),
    "num_items_in_batch": Refusal("a training loss's normaliser: drop it", example=4),
    "debug_io": Refusal("a model-debugging hook opttree does not run: " + NO_DRAFT, example=True),
    "mm_encoder_outputs": Refusal("a multimodal encoder's outputs: opttree decodes text-only causal LMs; "
                                  + NO_DRAFT),
}

SETS = {"honoured": HONOURED, "refused": REFUSED, "not applying": NOT_APPLYING}


def placement(name: str) -> list[str]:
    """The sets ``name`` is in (exactly one for a placed argument)."""
    return [label for label, members in SETS.items() if name in members]


def unplaced(names) -> set[str]:
    """The names in no set or in more than one."""
    return {name for name in names if len(placement(name)) != 1}


# ---------------------------------------------------------------------------------------------
# the arguments: declared here; tests/test_contract.py reads the installed transformers' source and
# signatures and fails where these declarations and it part


#: generate()'s own named parameters (transformers 5.18.0 to 5.24.0)
GENERATE_PARAMETERS = ("inputs", "generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                       "synced_gpus", "assistant_model", "streamer", "negative_prompt_ids",
                       "negative_prompt_attention_mask", "custom_generate")
#: the keywords generate() takes out of its ``**kwargs`` itself before the rest become model kwargs: its own
#: body pops trust_remote_code (and input_ids from the model kwargs), ``_extract_generation_mode_kwargs``
#: pops tokenizer and assistant_tokenizer
POPPED_BY_GENERATE = ("trust_remote_code", "input_ids", "tokenizer", "assistant_tokenizer")
#: the keywords generate()'s decorators rename to ``cache`` (from 5.24, the transformers whose generate()
#: names its cache ``cache``; none before)
RENAMED_TO_CACHE = ("past_key_values", "cache_params") if GENERATE_CACHE_NAME == NEW_CACHE_NAME else ()
#: the model kwargs ``_validate_model_kwargs`` lets through for any model (its ``key not in [...]`` list)
ALWAYS_ACCEPTED = ("debug_io", "mm_encoder_outputs")


def config_fields() -> set[str]:
    """Every field of a default GenerationConfig (its to_dict(), the form generate() reads it in)."""
    return set(GenerationConfig().to_dict())


def generate_signature() -> set[str]:
    """generate()'s own parameters, the keywords it pops from ``**kwargs`` before the model kwargs are
    split off, and those its decorators rename (declared above)."""
    return {*GENERATE_PARAMETERS, *POPPED_BY_GENERATE, *RENAMED_TO_CACHE}


def model_kwargs(model) -> set[str]:
    """The model kwargs generate() lets through for ``model`` (its ``_validate_model_kwargs``): the
    model's prepare_inputs_for_generation's parameters, its forward's when that takes ``**kwargs``,
    transformers' model-agnostic TransformersKwargs, and :data:`ALWAYS_ACCEPTED`."""
    from transformers.utils.generic import TransformersKwargs

    names = set(inspect.signature(model.prepare_inputs_for_generation).parameters)
    if names & {"kwargs", "model_kwargs"}:
        names |= set(inspect.signature(model.forward).parameters)
    names |= set(TransformersKwargs.__optional_keys__) | set(ALWAYS_ACCEPTED)
    return names - {"self", "args", "kwargs", "model_kwargs"}


def generate_arguments(model) -> set[str]:
    """Every argument plain ``model.generate()`` takes: the declared ones and ``model``'s own inputs."""
    return config_fields() | generate_signature() | model_kwargs(model)
