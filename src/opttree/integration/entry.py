"""Three ways into generate(): a callable for ``custom_generate=``, a GenerationMixin override
that accepts ``draft_model=`` (get it with :func:`speculative`), and :class:`SpeculativeGenerator`.
All three run generate()'s own preparation (generation config, logits processors and warpers,
stopping criteria with EOS and max length) and then :func:`opttree.loop.generation.speculative_decode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..budget import calibration
from ..drafters import make_drafter
from ..drafters.make import check_pair, is_draft_model
from ..hf import kv_cache
from ..hf.compat import cache_from_generate, generate_locals, output_cache, streamer_kept_by_generate
from ..hf.compiled import VerifyForward
from ..kernels.linears import fast_linears
from ..hf.validation import check_generation_mode, check_inputs, context_length
from ..loading import prepare_draft
from ..loop.generation import DecodeSettings, speculative_decode
from ..loop.model_inputs import ModelInputs
from ..loop.stats import GenerationStats
from ..tree.config import TreeConfig
from ..tree.sizes import padded_size
from ..verify.sampling import draft_to_probs
from .arguments import check_call, check_dropped_arguments, stop_strings_criterion
from .defaults import TREE_ARGS, given_settings, resolve


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """generate()'s usual output (``return_dict_in_generate=True``) plus opttree's ``stats``."""

    stats: GenerationStats | None = None


def _decode(model, draft_model, given: dict, input_ids, logits_processor, stopping_criteria,
            generation_config, streamer, generator, model_kwargs, prompt_streamed: bool = False):
    """given: the tree arguments the user passed (defaults.py resolves the rest); prompt_streamed:
    generate() has already put the prompt into ``streamer``."""
    if draft_model is None:
        raise ValueError("speculative generation needs draft_model=<a small causal LM with the target's vocabulary>")
    TreeConfig(**given)  # bad settings fail before anything is loaded
    check_generation_mode(generation_config)
    check_call(generation_config, model_kwargs, logits_processor, input_ids)  # the contract's refusals (contract.py)
    given_cache = cache_from_generate(model_kwargs)
    if given_cache is not None:  # a cache opttree cannot rewrite: refused before calibration's forwards
        kv_cache.check_cache(given_cache, 0)
    draft_model = prepare_draft(draft_model, model)  # a draft folder: loaded once for this call
    sampling = bool(generation_config.do_sample)
    to_probs = draft_to_probs(logits_processor) if sampling else None  # the tree sees the q the verifier sees
    drafter = make_drafter(draft_model, model, to_probs)
    max_context = context_length(model)
    if drafter.context_length is not None:
        max_context = min(max_context or drafter.context_length, drafter.context_length)
    attention_mask = model_kwargs.get("attention_mask")
    check_inputs(input_ids, attention_mask, max_context)
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError("streamers take one sequence (generate()'s rule): stream one prompt per generate() call")
    config = resolve(given, can_calibrate=calibration.calibration_prefix(model, drafter) is not None)
    # nodes/threshold="auto": measure this machine (a scratch drafter of the same kind is timed)
    policy = calibration.policy_maker(config, model, drafter, drafter.fresh)
    drafters = drafter.rows(input_ids.shape[0])
    max_length = stopping_criteria.max_length or generation_config.max_length
    cache = cache_from_generate(model_kwargs)
    if cache is None:
        cache = kv_cache.new_cache(model)
    room = cache_room(input_ids, max_length, max_context, config, policy().max_nodes)
    if kv_cache.is_static(cache) and input_ids.shape[0] > 1:
        raise NotImplementedError("a StaticCache with a batch of prompts: opttree keeps a batch's rows in a cache "
                                  "that grows; pass one prompt per call with cache_implementation='static', or "
                                  "drop cache_implementation= for the batch")
    for each in [cache, *drafters.caches()]:
        kv_cache.check_cache(each, room)
    verify = VerifyForward.of(model, model_kwargs, generation_config)  # compiled where generate() would compile
    if streamer is not None and not prompt_streamed:
        streamer.put(input_ids.cpu())
    pad = generation_config._pad_token_tensor
    settings = DecodeSettings(
        config, logits_processor, stopping_criteria,
        max_length=max_length,
        context_length=max_context or (1 << 62),
        pad_token_id=None if pad is None else int(pad),
        pad_finished=any(hasattr(c, "eos_token_id") for c in stopping_criteria),  # generate()'s own test
        do_sample=sampling,
        streamer=streamer,
        generator=generator,
        output_scores=bool(generation_config.output_scores),
        output_logits=bool(generation_config.output_logits),
        new_policy=policy,
        verify_forward=verify,
    )
    # few-row CPU linears' kernels (kernels.linears); a compiled target's linears are the compiler's
    kernels = [m for m in [model, *drafter.modules()] if not (verify.compiles and m is model)]
    with torch.inference_mode(), fast_linears(*kernels, on=bool(kernels)):
        result = speculative_decode(model, drafters, input_ids, cache, settings, attention_mask=attention_mask,
                                    model_inputs=ModelInputs.of(model_kwargs))
    if generation_config.return_dict_in_generate:  # a batch's cache has lost its finished rows: not returned
        return SpeculativeDecoderOnlyOutput(
            sequences=result.sequences, scores=result.scores, logits=result.logits,
            stats=result.stats, **output_cache(cache if input_ids.shape[0] == 1 else None),
        )
    return result.sequences


def cache_room(input_ids: torch.Tensor, max_length: int, max_context: int | None, config: TreeConfig,
               max_nodes: int) -> int:
    """The most slots a cache may reach: the longest sequence plus one step's tree padded to its
    verification size; a batch also leaves holes (each step adds 1 + the most tokens any row accepted)."""
    if input_ids.shape[0] == 1:
        return min(max_length, max_context or max_length) + padded_size(max_nodes + 1)
    steps = max(max_length - input_ids.shape[1], 1)
    return input_ids.shape[1] + steps * (1 + min(max_nodes, config.max_depth)) + padded_size(max_nodes + 1)


def speculative_generate(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus=False,
    streamer=None,
    draft_model=None,
    nodes=None,
    threshold=None,
    max_depth=None,
    strategy=None,
    verifier=None,
    static_tree=None,
    generator: torch.Generator | None = None,
    **model_kwargs,
):
    """Use as ``model.generate(**inputs, custom_generate=speculative_generate, draft_model=draft)``
    on any transformers causal LM; ``nodes``, ``threshold``, ``max_depth``, ``strategy``,
    ``verifier`` and ``static_tree`` are :class:`TreeConfig`'s; ``generator`` seeds sampling.
    generate()'s ``streamer=`` gets every new token and ``end()`` (generate() keeps the streamer
    from a callable after putting the prompt in it: :func:`opttree.hf.compat.streamer_kept_by_generate`)."""
    given = given_settings(nodes=nodes, threshold=threshold, max_depth=max_depth, strategy=strategy,
                           verifier=verifier, static_tree=static_tree)
    caller = generate_locals()  # what generate() kept from this callable (read only)
    check_dropped_arguments(model, {k: caller.get(k) for k in ("assistant_model", "synced_gpus")})
    kept = streamer_kept_by_generate()
    streamer = kept if streamer is None else streamer
    return _decode(model, draft_model, given, input_ids, logits_processor, stopping_criteria,
                   generation_config, streamer, generator, model_kwargs,
                   prompt_streamed=kept is not None and kept is streamer)


def _bound(draft_model, given: dict, streamer, generator):
    """A custom_generate callable with opttree's arguments bound (and the user's streamer)."""

    def custom_generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                        synced_gpus=False, **model_kwargs):
        model_kwargs.pop("streamer", None)
        return _decode(model, draft_model, given, input_ids, logits_processor, stopping_criteria,
                       generation_config, streamer, generator, model_kwargs)

    return custom_generate


def bind_call(model, draft_model, generator, kwargs: dict):
    """generate()'s ``custom_generate=`` callable for ``model.generate(**kwargs)`` with ``draft_model=``:
    takes opttree's tree arguments and the streamer out of ``kwargs`` (in place) and checks them first;
    what generate() would drop before a callable is refused or, for stop_strings=, made here."""
    given = given_settings(**{k: kwargs.pop(k) for k in TREE_ARGS if k in kwargs})
    if kwargs.get("assistant_model") is not None:
        raise ValueError("draft_model= and assistant_model= are two speculative methods; pass one (opttree "
                         "takes the assistant itself as draft_model=)")
    TreeConfig(**given)  # bad settings fail now, before generate() prepares anything
    check_dropped_arguments(model, kwargs)
    stop_strings_criterion(model, kwargs)
    return _bound(draft_model, given, kwargs.pop("streamer", None), generator)


def hub_generate(model, draft_model=None, generator=None, **arguments):
    """The Hub convention's entry: ``model.generate(custom_generate=<a folder or Hub repo holding
    custom_generate/generate.py>, trust_remote_code=True, draft_model=..., nodes=...)`` hands every
    generate() argument to that file's ``generate(model, ...)``, which calls this. It runs stock
    generate() (the model class's own) with opttree as its decoding method."""
    if draft_model is None:
        raise ValueError("opttree's custom_generate needs draft_model=<a small causal LM with the target's "
                         "vocabulary, a draft folder, or 'prompt_lookup'>")
    return type(model).generate(model, custom_generate=bind_call(model, draft_model, generator, arguments), **arguments)


class SpeculativeGenerationMixin:
    """Adds ``draft_model=``, the :class:`TreeConfig` arguments and ``generator=`` to generate();
    without ``draft_model`` generate() is untouched."""

    def generate(self, *args, draft_model=None, generator=None, **kwargs):
        if draft_model is None:
            given = given_settings(**{k: kwargs.pop(k) for k in TREE_ARGS if k in kwargs})
            if given or generator is not None:
                raise ValueError(f"{sorted(given) or ['generator']} need draft_model=")
            return super().generate(*args, **kwargs)
        if isinstance(kwargs.get("custom_generate"), str):  # a Hub method (opttree's own folder, say) gets them all
            extra = {} if generator is None else {"generator": generator}
            return super().generate(*args, draft_model=draft_model, **extra, **kwargs)
        custom = kwargs.pop("custom_generate", None)
        if custom is not None and custom is not speculative_generate:
            raise ValueError("draft_model= runs opttree through generate()'s custom_generate hook; pass "
                             "draft_model= or custom_generate=, not both")
        return super().generate(*args, custom_generate=bind_call(self, draft_model, generator, kwargs), **kwargs)

    def __reduce_ex__(self, protocol):
        """Pickling (torch.save, multiprocessing) keeps the speculative class: it is rebuilt from the
        model's own class by :func:`_new_speculative` rather than looked up by name."""
        reduced = super().__reduce_ex__(protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 3:
            raise TypeError(f"cannot pickle {type(self).__name__}: unexpected reduce value")
        return (_new_speculative, (type(self)._opttree_base,), *reduced[2:])


_CLASSES: dict[type, type] = {}  # a model class -> its speculative subclass (one per class)


def speculative_class(cls: type) -> type:
    """The subclass of ``cls`` with :class:`SpeculativeGenerationMixin` (same name, module and
    qualified name, so save_pretrained and reprs are unchanged); made once per class."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(cls.__name__, (SpeculativeGenerationMixin, cls),
                             {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_opttree_base": cls})
    return _CLASSES[cls]


def _new_speculative(cls: type):
    """An empty instance of ``cls``'s speculative subclass, for unpickling (the state follows)."""
    speculative_cls = speculative_class(cls)
    return speculative_cls.__new__(speculative_cls)


def speculative(model):
    """Give an existing transformers model the generate() that accepts ``draft_model=``.

    The model keeps its weights, config and class name (so save_pretrained is unchanged); only
    its class gains :class:`SpeculativeGenerationMixin`. Returns the same object, changed in place:
    afterwards ``model.generate(...)`` without ``draft_model=`` is still stock generate(), and
    ``custom_generate=speculative_generate`` still works on it.
    """
    cls = type(model)
    if isinstance(model, SpeculativeGenerationMixin):
        return model
    if not hasattr(model, "generate"):
        raise TypeError(f"{cls.__name__} has no generate(); pass a causal LM such as AutoModelForCausalLM")
    model.__class__ = speculative_class(cls)
    return model


class SpeculativeGenerator:
    """A target/draft pair with the usual generate() arguments.

    ``draft``: anything ``draft_model=`` takes (a model, a folder written by ``opttree distill``,
    ``"prompt_lookup"``, a Drafter). Tree arguments left out: see :mod:`opttree.integration.defaults` (with
    neither ``nodes`` nor ``threshold``, "auto"). ``generator``: a ``torch.Generator`` used for
    sampling when a generate() call passes none.

    >>> gen = SpeculativeGenerator(target, draft)
    >>> out = gen.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=64)
    >>> gen.last_stats.mean_accepted_tokens
    """

    def __init__(self, target, draft, nodes=None, threshold=None, max_depth=None, strategy=None, verifier=None,
                 static_tree=None, tokenizer=None, draft_tokenizer=None, generator: torch.Generator | None = None):
        draft = prepare_draft(draft, target)
        if is_draft_model(draft):
            check_pair(target, draft, tokenizer, draft_tokenizer)
        self.target = target
        self.draft = draft
        self.settings = given_settings(nodes=nodes, threshold=threshold, max_depth=max_depth, strategy=strategy,
                                       verifier=verifier, static_tree=static_tree)
        self.config = resolve(self.settings)  # validated now: what a call runs with where "auto" can calibrate
        self.generator = generator
        self.last_stats: GenerationStats | None = None

    def generate(self, inputs=None, generator: torch.Generator | None = None, **kwargs):
        """generate()'s arguments; tree arguments given here (``nodes=``, ``threshold=``, ...) override
        the constructor's for this call."""
        settings = {**self.settings, **given_settings(**{k: kwargs.pop(k) for k in TREE_ARGS if k in kwargs})}
        TreeConfig(**settings)  # bad settings fail before generate() prepares anything
        if kwargs.get("draft_model") is not None or kwargs.get("custom_generate") is not None:
            raise ValueError("this SpeculativeGenerator already has its draft; pass draft_model= to its constructor, "
                             "or call the target's own generate() with draft_model=/custom_generate=")
        check_dropped_arguments(self.target, kwargs)
        stop_strings_criterion(self.target, kwargs)
        streamer = kwargs.pop("streamer", None)
        want_dict = kwargs.pop("return_dict_in_generate", False)
        out = self.target.generate(
            inputs, custom_generate=_bound(self.draft, settings, streamer, generator or self.generator),
            return_dict_in_generate=True, **kwargs,
        )
        self.last_stats = out.stats
        return out if want_dict else out.sequences
