"""The decoding methods a benchmark compares, all through HF ``generate()``, greedy, batch 1.

* ``plain``: ``generate()`` itself, the reference every other method must reproduce exactly;
* ``plain-fast`` (also ``assisted-fast``, ``lookup-fast``): the HF method inside
  :func:`opttree.kernels.linears.fast_linears`, the linears' kernels opttree's loop runs under (plain at its
  fastest here): it shows how much of opttree's speed-up those kernels alone give;
* ``assisted``: HF assisted generation with the same draft (``assistant_model=``), a chain draft;
* ``lookup``: HF prompt lookup decoding (``prompt_lookup_num_tokens=``), no draft model;
* ``opttree``: OPT-Tree draft trees (arXiv 2406.17276) via ``custom_generate=speculative_generate``;
* ``plain-compiled``, ``assisted-compiled``, ``opttree-compiled``: the same over a static cache of
  one fixed size with generate()'s ``compile_config``, on every device (transformers compiles only
  on CUDA and a few others by itself): HF's own fast path, and opttree's verification through the
  same compiled forward. The compile happens in the runner's warm-up, timed apart.

A :class:`Method` maps a prompt to a :class:`Generated`; the runner times the call. Tokens per
step of the HF methods are read from the committed length each time generate() consults its
stopping criteria, which it does once per target forward that emits tokens (plain: every token;
assisted and lookup: every verification); opttree reports its steps in ``output.stats``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ..drafters.make import is_draft_model
from ..hf import compat
from ..kernels.linears import fast_linears
from ..integration.defaults import TREE_ARGS, TreeArguments, resolve
from ..integration.entry import speculative_generate
from ..loop.stats import GenerationStats
from .records import EAGLE3_CHAINS

METHODS = ("plain", "plain-fast", "assisted", "lookup", "opttree")  # the default set
HF_METHODS = ("plain", "assisted", "lookup")  # each also as "<name>-fast"
FAST = "-fast"  # an HF method under opttree's linears' kernels
COMPILED = "-compiled"  # over a static cache, compiled as generate() compiles plain decoding
COMPILED_METHODS = ("plain", "assisted", "opttree")  # each also as "<name>-compiled"
PEER_METHODS = ("vllm", EAGLE3_CHAINS)  # the engine in its own process (opttree.bench.peers), as Method objects
KNOWN_METHODS = (tuple(x for m in HF_METHODS for x in (m, f"{m}{FAST}")) + ("opttree", "opttree-lookup")
                 + tuple(f"{m}{COMPILED}" for m in COMPILED_METHODS) + PEER_METHODS)  # every name --methods takes


@dataclass
class Generated:
    sequences: torch.Tensor  # [1, T + new] long: the prompt and the new tokens
    accept_lengths: list[int]  # tokens emitted by each target forward that emitted any
    stats: GenerationStats | None = None  # opttree's own record (trees, E(A), draft/verify time)
    seconds: float | None = None  # an engine's own time for the call (its worker's clock); None: the runner's
    drafts: int | None = None  # an engine's chain: verifications of a draft
    accepted_per_pos: list[int] = field(default_factory=list)  # of those, how many accepted position i


@dataclass
class Method:
    """name: the column in the report; generate(input_ids [1, T] long, max_new_tokens) -> Generated."""

    name: str
    generate: Callable[[torch.Tensor, int], Generated]
    settings: dict = field(default_factory=dict)  # written to the report's header
    uses_draft: bool = False


class StepRecorder(StoppingCriteria):
    """Never stops; records the sequence length each time generate() checks whether to stop."""

    def __init__(self):
        self.lengths: list[int] = []

    def __call__(self, input_ids, scores, **kwargs):  # input_ids: [1, L] long
        self.lengths.append(int(input_ids.shape[1]))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def accept_lengths(self, prompt_len: int) -> list[int]:
        previous, out = prompt_len, []
        for length in self.lengths:
            out.append(length - previous)
            previous = length
        return out


def greedy_kwargs(model, input_ids: torch.Tensor, max_new_tokens: int) -> dict:
    """The arguments every method shares: greedy, no padding, the same length limit."""
    config = model.generation_config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(pad, (list, tuple)):
        pad = pad[0]
    kwargs = dict(attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens,
                  temperature=None, top_p=None, top_k=None)
    if pad is not None:
        kwargs["pad_token_id"] = pad
    return kwargs


COMPILE_BACKEND = {"backend": "inductor"}  # opttree bench --compile-backend: "eager" for a quick dry run


def compiled_kwargs(target, max_cache_len: int) -> dict:
    """generate()'s arguments for its compiled path: a static cache of ``max_cache_len`` slots (one
    size for every prompt, so no length recompiles) and a ``compile_config`` that compiles on the
    target's device, whatever it is (with :data:`COMPILE_BACKEND`'s backend)."""
    from transformers import CompileConfig, GenerationConfig

    backend = COMPILE_BACKEND["backend"]
    config = CompileConfig(backend=backend) if backend == "inductor" else CompileConfig(backend=backend, mode=None)
    config._compile_all_devices = target.device.type != "cuda"  # CUDA compiles by itself; elsewhere asked for
    kwargs = dict(cache_implementation="static", compile_config=config)
    if "max_cache_len" in GenerationConfig().to_dict():  # transformers that size a static cache up front
        kwargs["max_cache_len"] = max_cache_len
    return kwargs


def _compiled_settings(kwargs: dict) -> dict:
    config = kwargs["compile_config"]
    return {"cache": "static", "max_cache_len": kwargs.get("max_cache_len", "per call"),
            "compile": f"compile_config (backend {config.backend}, mode {config.mode})"}


def _hf_method(name: str, target, settings: dict, uses_draft: bool = False, **extra) -> Method:
    def generate(input_ids, max_new_tokens):
        recorder = StepRecorder()
        out = target.generate(input_ids, stopping_criteria=StoppingCriteriaList([recorder]),
                              **greedy_kwargs(target, input_ids, max_new_tokens), **extra)
        return Generated(out, recorder.accept_lengths(input_ids.shape[1]))

    return Method(name, generate, settings, uses_draft)


def plain_method(target) -> Method:
    return _hf_method("plain", target, {"generate": "greedy"})


def with_kernel(method: Method, *models) -> Method:
    """``method`` run inside :func:`~opttree.kernels.linears.fast_linears` (off unless one of ``models``
    is a float32/bfloat16 CPU model, as in opttree's loop), named ``<name>-fast``."""
    def generate(input_ids, max_new_tokens):
        with fast_linears(*models):
            return method.generate(input_ids, max_new_tokens)

    return Method(f"{method.name}{FAST}", generate, {**method.settings, "linear": "opttree.kernels.linears"},
                  method.uses_draft)


def assisted_method(target, draft, num_assistant_tokens: int | None = None, schedule: str | None = None,
                    extra: dict | None = None) -> Method:
    """HF assisted generation. Its draft length schedule lives in ``draft.generation_config``
    (default: 20 tokens, "heuristic", which carries over from one generate() call to the next).
    ``extra``: more generate() arguments (a static cache and a compile_config: ``assisted-compiled``)."""
    if num_assistant_tokens is not None:
        draft.generation_config.num_assistant_tokens = num_assistant_tokens
    if schedule is not None:
        draft.generation_config.num_assistant_tokens_schedule = schedule
    config = draft.generation_config
    settings = {"num_assistant_tokens": config.num_assistant_tokens or "HF default",
                "num_assistant_tokens_schedule": config.num_assistant_tokens_schedule or "HF default"}
    if extra:
        settings.update(_compiled_settings(extra))
    name = "assisted" + (COMPILED if extra else "")
    return _hf_method(name, target, settings, uses_draft=True, assistant_model=draft, **(extra or {}))


def lookup_method(target, num_tokens: int = 10, max_ngram_size: int | None = None) -> Method:
    extra = {"prompt_lookup_num_tokens": num_tokens}
    if max_ngram_size is not None:
        extra["max_matching_ngram_size"] = max_ngram_size
    return _hf_method("lookup", target, dict(extra), **extra)


def opttree_method(target, draft, name: str = "opttree", extra: dict | None = None, **tree) -> Method:
    """opttree through the public ``custom_generate=`` entry point; ``tree`` holds TreeConfig
    arguments (nodes, threshold, max_depth, strategy, verifier). ``draft`` may be a model or
    anything ``draft_model=`` accepts (e.g. ``"prompt_lookup"`` where that drafter exists);
    ``extra``: more generate() arguments (a static cache and a compile_config)."""
    config = tree_config(tree)  # validates now; what one prompt runs with (opttree.integration.defaults)

    def generate(input_ids, max_new_tokens):
        out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft,
                              return_dict_in_generate=True, **{k: v for k, v in tree.items() if v is not None},
                              **greedy_kwargs(target, input_ids, max_new_tokens), **(extra or {}))
        return Generated(out.sequences, out.stats.accept_lengths, out.stats)

    settings = {k: getattr(config, k) for k in ("nodes", "threshold", "max_depth", "strategy", "verifier")}
    if extra:
        settings.update(_compiled_settings(extra))
    if isinstance(draft, str):
        settings["draft"] = draft
    return Method(name, generate, settings, uses_draft=not isinstance(draft, str))


def tree_config(tree: dict):
    """The TreeConfig one prompt runs with for these tree settings (None: left out); ValueError naming an
    unknown setting, or a bad value and what is accepted (TreeConfig's own words)."""
    unknown = set(tree) - set(TREE_ARGS)
    if unknown:
        raise ValueError(f"unknown tree settings {sorted(unknown)}; known: {', '.join(TREE_ARGS)}")
    return resolve(TreeArguments.of(**tree))


SPEC_ONLY = ("compiled", "draft")  # an extra tree's keys that are no tree setting: its path, its own draft


def check_trees(tree: dict, extra_trees: list[dict]) -> None:
    """ValueError for the first bad setting of ``tree`` (the opttree methods') or of an extra tree
    (over ``tree``, its ``compiled`` flag and ``draft`` aside), as :func:`opttree_method` would raise it."""
    tree_config(tree)
    for spec in extra_trees:
        try:
            tree_config({**tree, **{k: v for k, v in spec.items() if k not in SPEC_ONLY}})
        except ValueError as error:
            label = ",".join(f"{k}={v}" for k, v in spec.items())
            raise ValueError(f"--opttree {label}: {error}") from None


def parse_tree_spec(spec: str) -> dict:
    """``"nodes=30,threshold=0.2,strategy=opt"`` -> TreeConfig arguments (numbers converted; ``draft``, a path,
    kept as written)."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"bad tree setting {part!r}: write key=value, e.g. nodes=30")
        key = key.strip().replace("-", "_")
        if key == "draft":
            out[key] = value.strip()
            continue
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = value.strip()
    return out


def check_methods(names) -> None:
    """ValueError naming a method of ``names`` (strings) that :func:`make_methods` does not know, with the
    known ones, or one this transformers cannot run (:func:`refuse_unsupported`)."""
    unknown = [name for name in names if name not in KNOWN_METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; known: {', '.join(KNOWN_METHODS)}")
    refuse_unsupported(names)


def refuse_unsupported(names) -> None:
    """ValueError naming a method of ``names`` this transformers cannot run, and the fix: ``assisted-compiled``
    where its assisted generation refuses a static cache (before 5.24)."""
    if "assisted" + COMPILED in names and not compat.assisted_takes_static_cache():
        raise ValueError(f"method 'assisted{COMPILED}' needs transformers >= {compat.ASSISTED_STATIC_FROM}: an older "
                         "one's assisted generation refuses a static cache; upgrade transformers or drop it from --methods")


def make_methods(names, target, draft, *, tree: dict | None = None, extra_trees: list[dict] | None = None,
                 prompt_lookup_num_tokens: int = 10, num_assistant_tokens: int | None = None,
                 assistant_schedule: str | None = None, assistant=None, max_cache_len: int = 2048,
                 drafts: dict | None = None) -> list[Method]:
    """Methods by name (``plain``, ``assisted``, ``lookup``, each also with ``-fast``: under opttree's
    linears' kernels; ``plain``, ``assisted``, ``opttree`` each also with ``-compiled``: over a static
    cache of ``max_cache_len`` slots, compiled; ``opttree``, ``opttree-lookup``); ``Method`` objects
    pass through. Each dict of ``extra_trees`` adds one more opttree method; ``draft=NAME`` in it: that method
    drafts with ``drafts[NAME]`` (loaded by the caller) instead of ``draft``.
    ``assistant``: the HF model for ``assisted`` (default: ``draft``, when it is an HF model; an
    EAGLE-style feature head is not one)."""
    tree = dict(tree or {})
    refuse_unsupported([name for name in names if isinstance(name, str)])
    if assistant is None and is_draft_model(draft):
        assistant = draft
    methods: list[Method] = []
    for name in names:
        if isinstance(name, Method):
            methods.append(name)
            continue
        kernel = name.endswith(FAST) and name.removesuffix(FAST) in HF_METHODS
        compiled = name.endswith(COMPILED) and name.removesuffix(COMPILED) in COMPILED_METHODS
        base = name.removesuffix(FAST) if kernel else name.removesuffix(COMPILED) if compiled else name
        extra = compiled_kwargs(target, max_cache_len) if compiled else {}
        if base == "plain":
            method = plain_method(target) if not compiled else _hf_method(
                name, target, {"generate": "greedy", **_compiled_settings(extra)}, **extra)
        elif base == "assisted":
            if assistant is None:
                raise ValueError(f"method {name!r} needs an HF draft model: --assistant PATH when --draft is a "
                                 "feature head (HF assisted generation cannot use one)")
            method = assisted_method(target, assistant, num_assistant_tokens, assistant_schedule, extra=extra)
        elif base == "lookup":
            method = lookup_method(target, prompt_lookup_num_tokens)
        elif base == "opttree":
            method = opttree_method(target, _need(draft, name), name=name, extra=extra, **tree)
        elif base == "opttree-lookup":
            method = opttree_method(target, "prompt_lookup", name=name, **tree)
        elif base in PEER_METHODS:
            raise ValueError(f"method {name!r} runs the engine in its own process: pass the Method objects of "
                             "opttree.bench.peers.peer_methods (the command line does)")
        else:
            raise ValueError(f"unknown method {name!r}; known: {', '.join(KNOWN_METHODS)}")
        methods.append(with_kernel(method, target, draft) if kernel else method)
    for spec in extra_trees or []:  # "compiled=1" in a spec: that tree over the compiled path
        spec = dict(spec)
        label = ",".join(f"{k}={v}" for k, v in spec.items() if k != "compiled")
        compiled = bool(spec.pop("compiled", 0))
        named = spec.pop("draft", None)
        if named is not None and named not in (drafts or {}):
            raise ValueError(f"--opttree draft={named}: that draft is not loaded; pass it in drafts={{{named!r}: ...}}")
        name = f"opttree{COMPILED if compiled else ''}({label})"
        extra = compiled_kwargs(target, max_cache_len) if compiled else None
        own = drafts[named] if named is not None else _need(draft, "opttree")
        method = opttree_method(target, own, name=name, extra=extra, **{**tree, **spec})
        if named is not None:
            method.settings["draft"] = named
        methods.append(method)
    return methods


def _need(draft, name: str):
    if draft is None:
        raise ValueError(f"method {name!r} needs a draft model (--draft PATH, or --draft truncated:N)")
    return draft
