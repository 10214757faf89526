"""Three ways into generate(): a callable for ``custom_generate=``, a GenerationMixin override
that accepts ``draft_model=`` (get it with :func:`speculative`), and :class:`SpeculativeGenerator`.
All three run generate()'s own preparation (generation config, logits processors and warpers,
stopping criteria with EOS and max length), then :func:`.prepare.prepare` and :func:`.decoding.decode`.
"""

from __future__ import annotations

import torch

from ..drafters.make import check_pair, is_draft_model
from ..hf.generate_call import dropped_by_generate
from ..loading import prepare_draft
from ..loop.stats import GenerationStats
from .decoding import SpeculativeDecoderOnlyOutput, decode
from .defaults import TREE_ARGS, TreeArguments, resolve
from .precheck import precheck
from .prepare import GenerateCall, Options, prepare


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
    generate()'s ``streamer=`` gets every new token and ``end()``: generate() puts the prompt into it and
    keeps it, ``assistant_model=`` and ``synced_gpus=`` from a callable, so they are read where it holds
    them (:func:`opttree.hf.generate_call.dropped_by_generate`) and pass the same :func:`precheck` as
    every other way in."""
    dropped = dropped_by_generate()
    arguments = {**dropped.keywords, "assistant_model": dropped.assistant_model, "synced_gpus": dropped.synced_gpus,
                 "streamer": streamer if streamer is not None else dropped.streamer,
                 "nodes": nodes, "threshold": threshold, "max_depth": max_depth, "strategy": strategy,
                 "verifier": verifier, "static_tree": static_tree}
    options = precheck(model, draft_model, generator, arguments,
                       prompt_streamed=streamer is None and dropped.streamer is not None)
    return decode(prepare(model, GenerateCall(input_ids, logits_processor, stopping_criteria, generation_config,
                                              model_kwargs), options))


def _bound(options: Options):
    """A custom_generate callable that decodes with ``options`` (the call's, checked by :func:`precheck`)."""

    def custom_generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                        synced_gpus=False, **model_kwargs):
        model_kwargs.pop("streamer", None)
        call = GenerateCall(input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
        return decode(prepare(model, call, options))

    return custom_generate


def hub_generate(model, draft_model=None, generator=None, **arguments):
    """The Hub convention's entry: ``model.generate(custom_generate=<a folder or Hub repo holding
    custom_generate/generate.py>, trust_remote_code=True, draft_model=..., nodes=...)`` hands every
    generate() argument to that file's ``generate(model, ...)``, which calls this. It runs stock
    generate() (the model class's own) with opttree as its decoding method."""
    options = precheck(model, draft_model, generator, arguments)
    return type(model).generate(model, custom_generate=_bound(options), **arguments)


class SpeculativeGenerationMixin:
    """Adds ``draft_model=``, the :class:`TreeConfig` arguments and ``generator=`` to generate();
    without ``draft_model`` generate() is untouched."""

    def generate(self, *args, draft_model=None, generator=None, **kwargs):
        if draft_model is None:
            given = [k for k in TREE_ARGS if kwargs.pop(k, None) is not None]
            if given or generator is not None:
                raise ValueError(f"{sorted(given) or ['generator']} need draft_model=")
            return super().generate(*args, **kwargs)
        if isinstance(kwargs.get("custom_generate"), str):  # a Hub method (opttree's own folder, say) gets them all
            extra = {} if generator is None else {"generator": generator}
            return super().generate(*args, draft_model=draft_model, **extra, **kwargs)
        options = precheck(self, draft_model, generator, kwargs, ours=speculative_generate)
        return super().generate(*args, custom_generate=_bound(options), **kwargs)

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
        self.settings = TreeArguments.of(nodes=nodes, threshold=threshold, max_depth=max_depth, strategy=strategy,
                                         verifier=verifier, static_tree=static_tree)  # validated now
        self.config = resolve(self.settings)  # what a call runs with where "auto" can calibrate
        self.generator = generator
        self.last_stats: GenerationStats | None = None

    def generate(self, inputs=None, generator: torch.Generator | None = None, **kwargs):
        """generate()'s arguments; tree arguments given here (``nodes=``, ``threshold=``, ...) override
        the constructor's for this call."""
        if kwargs.get("draft_model") is not None:
            raise ValueError("this SpeculativeGenerator already has its draft; pass draft_model= to its constructor, "
                             "or call the target's own generate() with draft_model=")
        options = precheck(self.target, self.draft, generator or self.generator, kwargs, under=self.settings)
        want_dict = kwargs.pop("return_dict_in_generate", False)
        out = self.target.generate(inputs, custom_generate=_bound(options), return_dict_in_generate=True, **kwargs)
        self.last_stats = out.stats
        return out if want_dict else out.sequences
