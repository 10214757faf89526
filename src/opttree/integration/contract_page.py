"""The page ``docs/arguments.md``: the contract (:mod:`.contract`) written out, every argument with
what opttree does with it. ``opttree arguments`` prints it; ``tests/test_arguments_page.py`` fails
when the shipped page and the contract disagree.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from ..tree import registry
from ..tree.config import TreeConfig
from .contract import ADDED, HONOURED, NOT_APPLYING, REFUSED

COMMAND = "opttree arguments > docs/arguments.md"

INTRO = """\
Every argument plain `generate()` takes is in exactly one of three sets, declared in
`src/opttree/integration/contract.py`: **honoured** (the output is plain's), **refused** by name
before any forward runs, with the fix in the error, or **not applying** (it changes nothing in plain's
greedy or sampled decoding of a decoder-only model). The names are `GenerationConfig`'s fields, a model's
own inputs, and what generate() takes itself (its parameters, the keywords it pops), declared in the
contract and checked against the installed transformers by `tests/test_contract.py`, which also fails on
a name in no set or in two: a transformers release that adds an argument fails the suite until it is
placed."""

NOTES = """\
- **Batches.** Each logits processor sees what plain shows it: a row's own context, left padding
  included, at its own batch index (`prefix_allowed_tokens_fn`'s `batch_id`, a repetition penalty's
  per-row `prompt_ignore_length`, a processor of your own with batch state). Processors run at tree
  nodes, possibly more than once per emitted token, so one that keeps state between calls cannot be
  honoured: transformers' stateful ones are refused.
- **Caches** (`opttree.hf.tree_cache`, the same on every way in, checked before any forward):

  | cache | opttree |
  |---|---|
  | none, `"dynamic"`, an empty `DynamicCache` | honoured |
  | `"static"` (and `"sliding_window"`, `"hybrid"`, `"hybrid_chunked"`, which build one), an empty `StaticCache` | honoured for one prompt |
  | `"offloaded"`, `"offloaded_static"`, `"quantized"`, `"paged"` | refused: drop `cache_implementation=` or use `"static"` |
  | an offloaded `DynamicCache`/`StaticCache`, another `Cache` class, a filled cache | refused, naming the cache to pass |
  | a `StaticCache` with a batch of prompts | refused: one prompt per call, or no cache for the batch |

  A static cache: the tree's mask spans the cache's slots and the accepted path is moved in place; one
  made by generate() gets room for one padded tree (`max_cache_len=` sizes it for every call); one too
  small is refused, naming the `max_cache_len` to ask for. Where generate() would compile plain
  decoding (a GPU, or `compile_config` with `_compile_all_devices`; not `disable_compile=True`),
  opttree's verification forwards run through generate()'s own compiled callable, one graph per fixed
  size; a size whose compile fails runs eagerly, with one warning. No graph is compiled mid-answer (a CPU
  compiles a 1 B model's size in about a minute): a fixed tree is verified at its budget's size, and with
  `nodes="auto"` the calibration compiles the sizes it times, on a cache as long as the call's, and decoding
  verifies only at those sizes. With no cache named, on a device
  generate() compiles for (a GPU; `compile_config._compile_all_devices` elsewhere), one prompt decodes on
  a static cache of opttree's own, so its verification compiles there too: the default on a GPU is the
  compiled path (`disable_compile=True` keeps it eager). A static cache opttree sizes holds a power of
  two of slots, shared by other prompt lengths, so they compile nothing new. A cache passed in comes
  back as plain leaves it (its tensors ordinary, `reset()` works). With `cache_implementation="paged"` on the third
  way transformers runs its continuous batching before it looks at `custom_generate=`: opttree never
  runs and cannot refuse it.
- **Sliding-window and chunked attention** (Gemma 2/3, GPT-OSS, Mistral with `sliding_window`, Cohere2,
  Starcoder2, Llama 4's chunks) past the window: each layer type gets its own tree mask, read from the
  model's config as transformers reads it, and for one prompt the cache's sliding layers keep the window
  and the step's slots.
- **`custom_generate=speculative_generate`** (a model not passed through `speculative()`): generate()
  drops `tokenizer=` before calling opttree and then refuses `stop_strings=` itself ("could not locate
  a tokenizer"); pass the criterion instead,
  `stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer=tok, stop_strings=[...])])`.
  generate() hands a callable neither the streamer nor `assistant_model=` nor `synced_gpus=`: opttree
  reads them from generate()'s frame (`opttree.hf.generate_call`, its one such seam), so the streamer
  streams and the other two are refused, as on every way in. generate() builds its cache before it calls
  opttree: where torch cannot give transformers a stream (torch 2.14's CUDA wheels on a CPU), an offloaded
  `cache_implementation=` raises transformers' own error on this way, as it does without a draft.
- **Streaming.** A `streamer` gets the prompt, every token as it is accepted, then `end()`, on every
  way in; one prompt per call, as generate()."""


def auto_paragraph() -> str:
    """What "auto" does, and where it cannot run, as the strategies' and verifiers' records say (tree/registry.py)."""
    strategies, verifiers = registry.not_auto()
    return f"""\
With neither `nodes` nor `threshold`, generate() runs `nodes="auto", threshold="auto"` where it can;
an argument left out next to one given takes the default above (`nodes=60, threshold=0.5` is OPT-Tree
as published). `"auto"` cannot run with {_alternatives("strategy=", strategies)}, with the {_alternatives("", verifiers)}
verifiers, or on a context too short to time: those calls get the fixed defaults
(`opttree.integration.defaults`). `SpeculativeGenerator(target, draft, ...)` takes the same arguments in
its constructor and per call."""


def _alternatives(prefix: str, names: list[str]) -> str:
    """`a="x"` / `"x"` and `"y"` / `"x"`, `"y"` and `"z"`: names as the page writes them."""
    quoted = [f'`{prefix}"{name}"`' for name in names]
    return " and ".join(quoted) if len(quoted) < 3 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(name: str) -> str:
    defaults = {f.name: f.default for f in fields(TreeConfig)}
    if name in defaults:
        value = defaults[name]
        return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"
    return "required" if name == "draft_model" else "`None`"


def _where(check) -> str:
    return f"`{check.__module__.removeprefix('opttree.')}.{check.__name__}`"


def _table(header: tuple[str, ...], rows) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]


def markdown() -> str:
    """The whole page, from the contract's tables."""
    refused = [(f"`{name}`", r.fix, ", ".join(map(_where, r.checked_by)) or "the value, in every call")
               for name, r in sorted(REFUSED.items())]
    lines = [
        "# generate()'s arguments with a draft", "",
        f"<!-- generated from src/opttree/integration/contract.py by `{COMMAND}`; do not edit by hand -->", "",
        INTRO, "",
        "## The arguments opttree adds", "",
        *_table(("argument", "default", "what it does"),
                ((f"`{name}`", _default(name), text) for name, text in ADDED.items())), "",
        auto_paragraph(), "",
        f"## Honoured ({len(HONOURED)}): the output is plain's", "",
        *_table(("argument", "how"), ((f"`{name}`", text) for name, text in sorted(HONOURED.items()))), "",
        f"## Refused ({len(REFUSED)}): an error naming the argument and the fix, before any forward", "",
        *_table(("argument", "what to do instead", "checked by"), refused), "",
        f"## Not applying ({len(NOT_APPLYING)}): nothing to honour", "",
        *_table(("argument", "why"), ((f"`{name}`", text) for name, text in sorted(NOT_APPLYING.items()))), "",
        "## Notes", "",
        NOTES,
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, prog: str = "opttree arguments") -> int:
    argparse.ArgumentParser(prog=prog, description=f"Print generate()'s arguments with a draft as markdown "
                                                   f"(the page docs/arguments.md: {COMMAND}).").parse_args(argv)
    print(markdown(), end="")
    return 0


__all__ = ["COMMAND", "main", "markdown"]

if __name__ == "__main__":
    raise SystemExit(main())
