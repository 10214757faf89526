"""The verification forward compiled, where generate() would compile plain decoding.

generate() compiles the target's forward for decoding when the cache is a compilable one (a
``StaticCache``) on a device it compiles for (CUDA and a few others; any device with
``CompileConfig(_compile_all_devices=True)``), unless ``disable_compile=True``
(``GenerationMixin._valid_auto_compile_criteria``). opttree asks the same question with the same
objects and, where the answer is yes, runs its verification forwards through the same compiled
callable (``model.get_compiled_call(compile_config)``, shared with plain decoding): one graph per
verification size (:data:`opttree.tree.sizes.VERIFY_SIZES`: the shapes are fixed), captured as CUDA
graphs under ``mode="reduce-overhead"``, generate()'s default. The prefill and the draft's forwards
stay eager, as generate() keeps its prefill eager.

A size whose compile or compiled run fails falls back to the eager forward, with one warning per
size, never an abort of the call: the static cache's count is set back first, so the eager run
writes the same slots. What runs on a machine without CUDA is the same code path with the CPU as the
device (tests force it with ``_compile_all_devices``); the CUDA graphs themselves are checked only
where a GPU is lent (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from . import kv_cache

logger = logging.getLogger(__name__)


def generate_would_compile(model, model_kwargs: dict, generation_config) -> bool:
    """Whether generate() would compile ``model``'s decoding forward for this call (its own test)."""
    return bool(model._valid_auto_compile_criteria(model_kwargs, generation_config))


@dataclass
class VerifyForward:
    """The target's verification forward: compiled (with an eager fallback per size) or eager."""

    model: Callable  # the target (its eager __call__)
    compiled: Callable | None = None  # model.get_compiled_call(...); None: eager only
    failed: set[int] = field(default_factory=set)  # sizes (rows) that fell back to eager

    @classmethod
    def of(cls, model, model_kwargs: dict, generation_config) -> "VerifyForward":
        if not generate_would_compile(model, model_kwargs, generation_config):
            return cls(model)
        return cls(model, model.get_compiled_call(generation_config.compile_config))

    @property
    def compiles(self) -> bool:
        return self.compiled is not None

    def __call__(self, cache, rows: int, /, **kwargs):
        """One forward over ``rows`` new tokens (a verification size) on ``cache`` (also in ``kwargs``,
        under the model's own name for it)."""
        if self.compiled is None or rows in self.failed:
            return self.model(**kwargs)
        length = kv_cache.cache_length(cache)
        try:
            return self.compiled(**kwargs)
        except Exception as error:  # noqa: BLE001 - any failure of the compiler or the compiled code
            self.failed.add(rows)
            logger.warning("the compiled verification forward of %d rows failed (%s: %s); running it eagerly from now on",
                           rows, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
            kv_cache.rewind(cache, length)
            return self.model(**kwargs)


__all__ = ["VerifyForward", "generate_would_compile"]
