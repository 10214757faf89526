"""A draft timed in float32 and in bfloat16 as decoding runs it, for ``load_draft(..., dtype="auto")``.

The probe drives the draft through its drafter (:class:`~opttree.drafters.head.feature_head.FeatureHeadDrafter`
for a feature head, :class:`~opttree.drafters.model.ModelDrafter` for a draft model) on made-up
tokens: after a prefill of PROBE_PREFIX tokens, one *round* is, for each width w in PROBE_WIDTHS,
one decoding step's drafting: ``root_probs`` over one newly committed token, then ``expand`` of a
frontier of w nodes (a head's layer and its output rows over the kept vocabulary; a draft model's
forward over w tokens), then ``commit`` of none. The float32 copy runs under the few-row linear
kernels (:func:`opttree.kernels.linears.fast_linears`), as opttree's decoding loop runs it. The two
dtypes take turns within each round, so a load that comes and goes on a shared machine slows both
alike; after WARMUP_ROUNDS untimed rounds, the median of REPEATS timed ones (fewer, but
MIN_REPEATS, once the probe has run MAX_SECONDS): a fraction of a second for a small draft
(benchmarks/RESULTS.md, "Which dtype for the draft").

Nothing here changes torch's settings; the only state it leaves is what the kernel's own timing of
new shapes leaves (the same as the first decoding step would).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..drafters.base import Drafter
from ..drafters.head.base import DraftHead
from ..drafters.head.drafter import FeatureHeadDrafter
from ..drafters.model import ModelDrafter
from ..kernels import linears
from ..tree.draft_tree import DraftTree
from .turns import take_turns

PROBE_PREFIX = 32  # committed tokens under the timed calls
PROBE_WIDTHS = (2, 16)  # frontier widths of one round: a small tree's layer and a wide one's
WARMUP_ROUNDS = 1
REPEATS = 5
MIN_REPEATS = 2  # timed rounds even where the probe runs past MAX_SECONDS
MAX_SECONDS = 0.6  # no more timed rounds once the probe has run this long


@dataclass(frozen=True)
class DtypeTimes:
    """Median seconds of one probe round in each dtype; ``bfloat16_seconds`` is None where the
    draft does not run in bfloat16 on this device."""

    float32_seconds: float
    bfloat16_seconds: float | None


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` whose floating parameters and buffers are in ``dtype``; ``model`` is left
    as it is, and so is what it shares with the target: a draft model's embedding (the target's
    own module) is copied into the new dtype, a feature head's (held outside its modules) stays
    shared. A plain ``model.to(dtype)`` would cast the target's shared embedding in place."""
    def cast(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().to(dtype)
        return torch.nn.Parameter(out, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else out

    memo: dict[int, object] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point():
            memo[id(t)] = cast(t)
    if isinstance(model, DraftHead):
        for shared in model.shared_with_target():  # the target's embedding: shared, not copied
            memo[id(shared)] = shared
    return copy.deepcopy(model, memo)


def model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``model``'s first floating parameter (None: it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def probe_drafter(model: torch.nn.Module) -> Drafter:
    """The drafter that decoding would make of ``model`` (a feature head or a causal LM)."""
    if isinstance(model, DraftHead):
        return FeatureHeadDrafter(model)
    return ModelDrafter(model)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _hidden_size(model: torch.nn.Module) -> int | None:
    return model.c.hidden_size if isinstance(model, DraftHead) else None


def _vocab(model: torch.nn.Module) -> int:
    if isinstance(model, DraftHead):
        return model.c.vocab_size
    return int(model.get_input_embeddings().weight.shape[0])


class ProbeRun:
    """One candidate's drafter on its own made-up text: :meth:`round` drafts one step per width."""

    def __init__(self, model: torch.nn.Module, prefix: int = PROBE_PREFIX, widths: tuple[int, ...] = PROBE_WIDTHS):
        self.drafter, self.widths = probe_drafter(model), widths
        self.device, self.vocab, self.hidden = _device(model), _vocab(model), _hidden_size(model)
        self.sequence = (torch.arange(prefix, dtype=torch.long) * 7 % self.vocab).to(self.device)
        self._features(prefix - 1)  # the prompt's but the root's, as the decoding loop hands them
        self.drafter.root_probs(self.sequence)  # the prefill (not timed)

    def _features(self, n: int) -> None:
        if self.drafter.wants_hidden_states:
            self.drafter.add_features(torch.zeros(n, self.hidden, device=self.device))

    def step(self, width: int) -> None:
        """One decoding step's drafting: catch up one committed token, expand ``width`` children
        of the root in one call, commit none."""
        token = torch.tensor([(len(self.sequence) * 5 + 1) % self.vocab], dtype=torch.long, device=self.device)
        self.sequence = torch.cat([self.sequence, token])
        self._features(1)
        self.drafter.root_probs(self.sequence)
        tokens = (torch.arange(width, dtype=torch.long) * 3 + 1) % self.vocab
        pool = DraftTree(tokens.to(self.device), torch.full((width,), -1, dtype=torch.long, device=self.device),
                         torch.ones(width, device=self.device))
        self.drafter.expand_probs(pool, torch.arange(width, device=self.device))  # what decoding calls
        self.drafter.commit([])

    def round(self) -> None:
        for width in self.widths:
            self.step(width)
        _sync(self.device)


def time_rounds(rounds: dict[str, Callable[[], None]], warmup: int = WARMUP_ROUNDS, repeats: int = REPEATS,
                clock: Callable[[], float] = time.perf_counter, max_seconds: float = MAX_SECONDS) -> dict[str, float]:
    """``{name: median seconds of one call}``: ``warmup`` untimed calls of each, then up to
    ``repeats`` timed ones, the candidates taking turns; fewer (but at least MIN_REPEATS) once the
    whole has taken ``max_seconds`` (a machine so loaded that one round takes that long)."""
    start_all = clock()

    def go_on(done: int, _times) -> bool:
        return done < warmup + repeats and not (done >= warmup + MIN_REPEATS and clock() - start_all >= max_seconds)

    times = take_turns(rounds, go_on, clock)
    return {name: statistics.median(ts[warmup:]) for name, ts in times.items()}


def probe_dtypes(model: torch.nn.Module, repeats: int = REPEATS) -> DtypeTimes:
    """Time ``model`` (a loaded draft in any dtype) in float32 and in bfloat16 (copies where its
    dtype differs: ``model`` is left as it is). A bfloat16 copy that fails to run is no candidate."""
    models = {name: model if model_dtype(model) == dtype else cast_copy(model, dtype).eval()
              for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    with torch.inference_mode(), linears.fast_linears(*models.values()):  # as decoding runs (integration/decoding.py)
        runs = {"float32": ProbeRun(models["float32"])}
        try:
            runs["bfloat16"] = ProbeRun(models["bfloat16"])
            runs["bfloat16"].round()
        except (RuntimeError, NotImplementedError, TypeError):  # no bfloat16 kernels for some op here
            runs.pop("bfloat16", None)
        medians = time_rounds({name: run.round for name, run in runs.items()}, repeats=repeats)
    return DtypeTimes(medians["float32"], medians.get("bfloat16"))


__all__ = ["MAX_SECONDS", "MIN_REPEATS", "PROBE_PREFIX", "PROBE_WIDTHS", "REPEATS", "WARMUP_ROUNDS", "DtypeTimes", "ProbeRun", "cast_copy",
           "model_dtype", "probe_drafter", "probe_dtypes", "time_rounds"]
