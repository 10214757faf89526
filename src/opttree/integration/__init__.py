"""The face: how transformers' ``generate()`` reaches opttree.

* :mod:`.entry`: the ways in (``custom_generate=speculative_generate``, a model given ``draft_model=`` by
  :func:`speculative`, :class:`SpeculativeGenerator`, and :func:`hub_generate` for the Hub's
  ``custom_generate/`` folder). Each runs generate()'s own preparation, then one decode of the loop.
* :mod:`.precheck`: the one pre-check sequence every way in runs on the call's arguments before generate()
  prepares anything; it returns the call's ``Options``.
* :mod:`.prepare`: one call made ready to decode: every check before any forward, then the
  calibration and the cache opened; one value, ``DecodeCall``, that :mod:`.decoding` runs;
  :mod:`.target_cache`: the target's cache for the call (generate()'s, or a static one so that the
  verification compiles) and the slots the call needs.
* :mod:`.defaults`: what generate() does with the tree arguments left out (``"auto"`` where it can).
* :mod:`.contract`: every argument plain generate() takes (what generate() takes itself declared, checked
  against transformers by a test), honoured, refused by
  name, or documented as not applying, and the arguments opttree adds; :mod:`.arguments` enforces the
  refusals before any forward; :mod:`.contract_page` writes it all as ``docs/arguments.md``
  (``opttree arguments``).

May import: :mod:`opttree.loop`, :mod:`opttree.loading`, :mod:`opttree.budget`, :mod:`opttree.drafters`,
:mod:`opttree.verify`, :mod:`opttree.tree`, :mod:`opttree.hf`, :mod:`opttree.kernels` (the top floor: every
runtime folder). Nothing below imports it.
"""

from .entry import (SpeculativeDecoderOnlyOutput, SpeculativeGenerationMixin, SpeculativeGenerator, hub_generate,
                    speculative, speculative_generate)

__all__ = ["SpeculativeDecoderOnlyOutput", "SpeculativeGenerationMixin", "SpeculativeGenerator", "hub_generate",
           "speculative", "speculative_generate"]
