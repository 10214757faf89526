"""``nodes="auto"`` / ``threshold="auto"``: the tree that maximises tokens per SECOND on this machine.

OPT-Tree (arXiv 2406.17276) maximises E(A) = Σp̂ for a fixed node budget n and leaves the depth
threshold δ open. On a GPU verifying 60 nodes costs about one token; on a CPU it does not (8 nodes
~2x, 16-64 nodes ~3-4x one token). So each step we maximise the expected speed instead:

    speed(m) = (E_m + 1) / (T(m) + D)

E_m  = the sum of the m largest p̂ of the drafted pool (the top-m nodes by p̂ form a valid tree for
       every m; +1 is the bonus token),
T(m) = the target's latency to verify the root and m nodes (measured at warm-up),
D    = the drafting time of the step (draft forwards so far; sunk, the same for every m).

*Budget*: keep the m that maximises speed(m). *Depth* (the paper's open δ): one more layer costs
one draft forward c; with E* and T* the chosen tree's, it raises the speed only if the layer adds
more than  δ = (E* + 1) · c / (T* + D)  to E(A) — so δ follows from the cost ratio, and growth stops
(OPT-Tree's rule, with the last layer's gain as the estimate of the next one's) below it.

Calibration: T(n) for a few n and the draft's per-forward latency are measured on the actual
models at the first call (a few forwards each) and cached per (model class, name_or_path, size,
device, dtype), in memory. The measured T(n) is replaced by its lower envelope (non-decreasing;
a busy machine only adds time). Each step's measured verify/draft times then refresh the pair's
model online (exponential averages; the verify table is rescaled by measured / predicted), via
:meth:`AutoTreeConfig.observe`, and later generate() calls start from the refreshed model.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch

from .config import TreeConfig
from .masks import verification_inputs
from .tree import DraftTree

logger = logging.getLogger(__name__)

AUTO_MAX_NODES = 64  # the largest tree "auto" will ever verify (the pool cap)
VERIFY_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)  # tree sizes timed at calibration
DRAFT_WIDTH = 8  # tree nodes fed per timed draft forward (a typical layer)
CALIBRATION_PREFIX = 64  # cached tokens under the timed forwards
REFRESH = 0.1  # weight of each new step in the online averages


@dataclass
class LatencyModel:
    """Measured costs of one step's pieces, in seconds."""

    sizes: tuple[int, ...]  # tree sizes n (root not counted), ascending
    verify: tuple[float, ...]  # T(n): one target forward over the root and n nodes
    draft_forward: float  # one draft forward over one tree layer
    verify_scale: float = 1.0  # online correction: measured / predicted verify time

    def verify_time(self, n: float) -> float:
        """T(n), linear between measured sizes; beyond the last one the last segment's slope goes
        on (never downwards: more nodes never cost less)."""
        xs, ys = self.sizes, self.verify
        if len(xs) == 1:
            return ys[0] * self.verify_scale
        i = max(1, min(len(xs) - 1, next((k for k, x in enumerate(xs) if x >= n), len(xs) - 1)))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        slope = (y1 - y0) / (x1 - x0)
        if n > x1:
            slope = max(slope, 0.0)
            x0, y0 = x1, y1
        return max(y0 + slope * (n - x0), 0.0) * self.verify_scale

    def verify_times(self, m: int) -> torch.Tensor:
        """[m] float64: T(1) … T(m)."""
        return torch.tensor([self.verify_time(k) for k in range(1, m + 1)], dtype=torch.float64)

    def observe(self, tree_size: int, verify_seconds: float, draft_forwards: int, draft_seconds: float) -> None:
        """Refresh from one step's measured times."""
        predicted = self.verify_time(tree_size) / self.verify_scale
        if predicted > 0 and verify_seconds > 0:
            ratio = min(max(verify_seconds / predicted, 0.25), 4.0)
            self.verify_scale += REFRESH * (ratio - self.verify_scale)
        if draft_forwards > 0 and draft_seconds > 0:
            self.draft_forward += REFRESH * (draft_seconds / draft_forwards - self.draft_forward)


def expected_speed(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float,
                   cap: int | None = None) -> torch.Tensor:
    """speed(m) for m = 1 … min(len, cap): (E_m + 1) / (T(m) + D).

    path_probs: [k] float, any order (the m largest are summed).
    returns:    [min(k, cap)] float64, entry m - 1 is speed(m).
    """
    ranked = torch.sort(path_probs.double().cpu(), descending=True).values[:cap]
    gain = torch.cumsum(ranked, 0) + 1.0  # [k]
    return gain / (latency.verify_times(len(ranked)) + draft_seconds)


def best_size(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float, cap: int | None = None) -> int:
    """The m (1 <= m <= cap) that maximises speed(m); 0 for an empty pool."""
    if len(path_probs) == 0:
        return 0
    speed = expected_speed(path_probs, latency, draft_seconds, cap)
    return int(torch.argmax(speed)) + 1  # first maximum: the smaller tree on ties


def depth_threshold(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float, size: int) -> float:
    """δ = (E* + 1) · c / (T* + D): the least E(A) gain that makes one more draft forward (cost
    c) pay, for the tree of the ``size`` highest p̂ (E*, T*)."""
    if size < 1:
        return 0.0
    e = float(torch.sort(path_probs.double().cpu(), descending=True).values[:size].sum())
    return (e + 1.0) * latency.draft_forward / (latency.verify_time(size) + draft_seconds)


@dataclass(frozen=True)
class AutoTreeConfig(TreeConfig):
    """A TreeConfig whose ``nodes="auto"`` / ``threshold="auto"`` were resolved against a measured
    :class:`LatencyModel`. ``nodes`` holds the pool cap, ``threshold`` the fixed δ (if not auto)."""

    latency: LatencyModel | None = field(default=None, compare=False, repr=False)
    auto_nodes: bool = False
    auto_threshold: bool = False

    def step_size(self, path_probs: torch.Tensor, draft_seconds: float) -> int:
        """How many of the highest-p̂ nodes to verify this step."""
        if not self.auto_nodes:
            return min(self.nodes, len(path_probs))
        return best_size(path_probs, self.latency, draft_seconds, self.nodes)

    def draft_seconds(self, forwards: int) -> float:
        """Estimated drafting time of a step after ``forwards`` expand() calls (+ the root's)."""
        return (forwards + 1) * self.latency.draft_forward

    def layer_threshold(self, path_probs: torch.Tensor, forwards: int) -> float:
        """δ for the layer-growth rule of OPT-Tree (builder.py), after ``forwards`` expansions."""
        if not self.auto_threshold:
            return self.threshold
        spent = self.draft_seconds(forwards)
        return depth_threshold(path_probs, self.latency, spent, self.step_size(path_probs, spent))

    def observe(self, step) -> None:
        """Refresh the latency model from a finished step (a :class:`~opttree.stats.StepStats`)."""
        if step.tree_size > 0 or step.verify_seconds > 0:
            self.latency.observe(step.tree_size, step.verify_seconds, step.draft_forwards, step.draft_seconds)


# ---------------------------------------------------------------------------------------------
# calibration

# ("verify", target key, …) -> T table; ("draft", draft key, …) -> seconds; ("pair", …) -> LatencyModel
_CALIBRATIONS: dict[tuple, object] = {}


def model_key(model) -> tuple:
    """(class, name_or_path, parameter count, device, dtype): what the latency depends on."""
    params = sum(p.numel() for p in model.parameters())
    name = getattr(model.config, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
    return (type(model).__name__, name, params, str(model.device), str(model.dtype))


def _timed_forward(model, cache, prefix: int, nodes: int, repeats: int) -> float:
    """Median seconds of one forward over a root and ``nodes`` tree nodes (children of the root)
    on a ``prefix``-token cache; the cache is cropped back after each."""
    from . import kv_cache

    vocab = int(model.get_input_embeddings().weight.shape[0])
    tokens = torch.arange(nodes, dtype=torch.long) % vocab
    tree = DraftTree(tokens.to(model.device), torch.full((nodes,), -1, dtype=torch.long, device=model.device),
                     torch.ones(nodes, device=model.device))
    inputs = verification_inputs(1, tree, prefix, model.dtype).as_kwargs()
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        start = time.perf_counter()
        model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=0)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        times.append(time.perf_counter() - start)
        kv_cache.keep_slots(cache, prefix, torch.empty(0, dtype=torch.long, device=model.device))
    return sorted(times[1:])[len(times[1:]) // 2]


def _prefilled_cache(model, prefix: int):
    from . import kv_cache

    cache = kv_cache.new_cache(model)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = (torch.arange(prefix, dtype=torch.long) * 7 % vocab)[None, :].to(model.device)
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def measure_verify(target, sizes=VERIFY_SIZES, prefix: int = CALIBRATION_PREFIX, repeats: int = 3) -> tuple[float, ...]:
    """T(n) for each n in ``sizes``, on the real target (cached per model)."""
    key = ("verify", model_key(target), tuple(sizes), prefix)
    if key not in _CALIBRATIONS:
        with torch.inference_mode():
            cache = _prefilled_cache(target, prefix)
            _CALIBRATIONS[key] = tuple(_timed_forward(target, cache, prefix, n, repeats) for n in sizes)
        logger.info("verify latency of %s: %s", key[1][0],
                    ", ".join(f"T({n})={t * 1e3:.1f}ms" for n, t in zip(sizes, _CALIBRATIONS[key])))
    return _CALIBRATIONS[key]


def measure_draft(draft, width: int = DRAFT_WIDTH, prefix: int = CALIBRATION_PREFIX, repeats: int = 3) -> float:
    """Seconds of one draft forward over ``width`` tree nodes (cached per model)."""
    key = ("draft", model_key(draft), width, prefix)
    if key not in _CALIBRATIONS:
        with torch.inference_mode():
            cache = _prefilled_cache(draft, prefix)
            _CALIBRATIONS[key] = _timed_forward(draft, cache, prefix, width - 1, repeats)
        logger.info("draft forward of %s: %.1f ms", key[1][0], _CALIBRATIONS[key] * 1e3)
    return _CALIBRATIONS[key]


def lower_envelope(times) -> tuple[float, ...]:
    """T(n) := min over m >= n of the measured T(m): non-decreasing in n, and robust to spikes
    (a busy machine only ever adds time to a measurement)."""
    out, low = [], float("inf")
    for t in reversed(list(times)):
        low = min(low, t)
        out.append(low)
    return tuple(reversed(out))


def calibrate(target, draft_model=None) -> LatencyModel:
    """The LatencyModel of this pair: measured once, then shared by every generate() call, which
    keep refreshing it from their steps. Without a draft model (a model-free drafter) the draft
    cost starts at zero and is learnt from the steps."""
    key = ("pair", model_key(target), model_key(draft_model) if draft_model is not None else None)
    if key not in _CALIBRATIONS:
        verify = lower_envelope(measure_verify(target))
        draft = measure_draft(draft_model) if draft_model is not None else 0.0
        _CALIBRATIONS[key] = LatencyModel(sizes=VERIFY_SIZES, verify=verify, draft_forward=draft)
    return _CALIBRATIONS[key]


def context_fits(model, prefix: int = CALIBRATION_PREFIX) -> bool:
    from .validation import context_length

    limit = context_length(model)
    return limit is None or limit > prefix + 2


def resolve(config: TreeConfig, target, drafter) -> TreeConfig:
    """Turn ``nodes="auto"`` / ``threshold="auto"`` into an :class:`AutoTreeConfig` measured on
    ``target`` and the drafter's model (if it has one); other configs pass through unchanged."""
    auto_nodes, auto_threshold = config.nodes == "auto", config.threshold == "auto"
    if not (auto_nodes or auto_threshold):
        return config
    draft_model = getattr(drafter, "model", None)
    if not context_fits(target) or (draft_model is not None and not context_fits(draft_model)):
        raise ValueError(f"nodes/threshold='auto' needs a context longer than {CALIBRATION_PREFIX + 2} tokens")
    latency = calibrate(target, draft_model)
    given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    given.update(nodes=AUTO_MAX_NODES if auto_nodes else config.nodes,
                 threshold=0.0 if auto_threshold else config.threshold)
    return AutoTreeConfig(**given, latency=latency, auto_nodes=auto_nodes, auto_threshold=auto_threshold)


__all__ = ["AUTO_MAX_NODES", "AutoTreeConfig", "LatencyModel", "best_size", "calibrate", "depth_threshold",
           "expected_speed", "resolve"]
