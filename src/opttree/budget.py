"""How big a tree each step drafts and verifies: one explicit seam, :class:`BudgetPolicy`.

The decoding loop (generation.py) asks the policy for each step's :class:`StepPlan` (the node
budget, δ, the widest layer to draft, and for ``"auto"`` a growth rule and a final cut) and tells
it what the step cost (:meth:`BudgetPolicy.observe` with the step's :class:`~opttree.stats.StepStats`).
:class:`FixedPolicy` is ``nodes=<int>, threshold=<float>``: OPT-Tree as published.
:class:`AutoPolicy` is ``nodes="auto"`` / ``threshold="auto"``: the tree that maximises tokens per
SECOND on this machine.

OPT-Tree (arXiv 2406.17276) maximises E(A) = Σp̂ for a fixed node budget n and leaves the depth
threshold δ open. On a GPU verifying 60 nodes costs about one token; on a CPU it does not (8 nodes
~2x, 16-64 nodes ~3-4x one token). So each step AutoPolicy maximises the expected speed instead:

    speed(m) = (E_m + 1) / (T(m) + D)

E_m  = the sum of the m largest p̂ of the drafted pool (the top-m nodes by p̂ form a valid tree for
       every m; +1 is the bonus token),
T(m) = the target's latency to verify the root and m nodes (measured; plus the rest of a step:
       cache surgery, commit),
D    = the drafting time of the step so far (measured: the catch-up forward, the layers actually
       drafted and the tree building; sunk, the same for every m).

*Budget*: verify the m that maximises speed(m), m = 0 (the root alone, as plain decoding) included. *Depth* (the paper's open δ): before each draft
forward the policy compares the best speed now with the best speed after one more layer of w
nodes, its cost c(w) (one ``drafter.expand`` over w nodes, measured) added to D and its p̂ guessed
from the last layer (:func:`next_layer_guess`); it stops when the layer would not pay, i.e. when
the layer's E(A) gain per second of drafting falls below the current rate. *Width*: a layer never
expands more than about twice the recent verified tree size (:func:`layer_width`), so a step
never pays for 64-wide layers it then prunes.

Calibration (:func:`calibrate`): T(n) is timed on the target for a few n; the drafter is timed
through its own protocol (``root_probs`` / ``expand`` over w nodes / ``commit``) on a scratch
drafter made for the purpose, so any Drafter works (a model, prompt lookup, a head drafter). A
drafter that cannot be copied starts with c = 0 and is learnt from the first steps. Each step's
measured times then refresh the model (T(n) as scale × table + offset, by exponentially weighted
least squares; c(w) by a scale; the rest of a step by an average), and later generate() calls in
the process start from the refreshed model.
Measurements are cached on disk per (target, drafter, device, dtype, torch threads) as JSON under
``$OPTTREE_CALIBRATION_DIR`` (default ``$OPTTREE_CACHE/calibration``, i.e.
``~/.cache/opttree/calibration``); ``OPTTREE_CALIBRATION=off`` neither reads nor writes it,
``OPTTREE_CALIBRATION=refresh`` measures again and overwrites it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from . import fast_linear
from .config import TreeConfig
from .masks import verification_inputs
from .tree import DraftTree

logger = logging.getLogger(__name__)

AUTO_MAX_NODES = 64  # the largest tree "auto" will ever verify (the pool budget)
VERIFY_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)  # tree sizes timed at calibration
DRAFT_WIDTHS = (1, 2, 4, 8, 16, 32)  # layer widths timed at calibration
CALIBRATION_PREFIX = 256  # committed tokens under the timed forwards (a chat prompt and some answer)
MIN_CALIBRATION_PREFIX = 16  # a shorter context cannot be calibrated: "auto" is refused
REPEATS = 5  # timed rounds per size (after one warm-up round); sizes interleaved within a round
CALIBRATION_VERSION = 3  # bump when what is measured changes: old files are then ignored
REFRESH = 0.1  # weight of each new step in the online latency averages
SIZE_REFRESH = 0.25  # weight of each step's verified size in the running mean tree size
WIDTH_PER_NODE = 2.0  # layer width cap = this × the running mean tree size
MIN_WIDTH = 2
START_SIZE = 4.0  # the running mean tree size before any step (first width cap: 8)


# ---------------------------------------------------------------------------------------------
# the seam


@dataclass
class LayerState:
    """What a builder knows after drafting a layer, for :attr:`StepPlan.grow`."""

    path_probs: torch.Tensor  # [m] float: p̂ of every pool node drafted so far this step (absolute)
    parents: torch.Tensor  # [m] long: each pool node's parent (-1: the root)
    previous: int  # pool size before the last layer (pool[previous:] is the last layer)
    next_width: int  # nodes the next draft forward would expand (the last layer's most probable)


@dataclass
class StepPlan:
    """One step's tree settings, from a :class:`BudgetPolicy`."""

    nodes: int  # node budget: the pool's best-``nodes`` set; the tree never keeps more
    threshold: float  # δ for a builder's own growth rule when ``grow`` is None
    width: int | None = None  # the most nodes one draft forward expands (None: no cap)
    grow: Callable[[LayerState], bool] | None = None  # draft one more layer? (None: E(A) gain > δ)
    size: Callable[[torch.Tensor], int] | None = None  # pool p̂ [k] -> nodes to verify (None: all kept)


class BudgetPolicy(Protocol):
    max_nodes: int  # the largest tree any step will verify (what caches must make room for)

    def plan(self) -> StepPlan:
        """Called at the start of each step, before the drafter's first call."""

    def observe(self, step) -> None:
        """The finished step (a :class:`~opttree.stats.StepStats`, with its measured times)."""


class FixedPolicy:
    """``nodes`` and ``threshold`` as given: OPT-Tree's rule, nothing measured."""

    def __init__(self, config: TreeConfig):
        self.config = config
        self.max_nodes = config.nodes

    def plan(self) -> StepPlan:
        return StepPlan(nodes=self.config.nodes, threshold=self.config.threshold)

    def observe(self, step) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# latency model


@dataclass
class LatencyTable:
    """Seconds measured at a few sizes; linear in between."""

    sizes: tuple[int, ...]  # ascending
    seconds: tuple[float, ...]

    def at(self, n: float) -> float:
        """Linear between measured sizes; beyond the last one the last segment's slope goes on
        (never downwards: more nodes never cost less)."""
        xs, ys = self.sizes, self.seconds
        if len(xs) == 1:
            return ys[0]
        i = max(1, min(len(xs) - 1, next((k for k, x in enumerate(xs) if x >= n), len(xs) - 1)))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        slope = (y1 - y0) / (x1 - x0)
        if n > x1:
            slope = max(slope, 0.0)
            x0, y0 = x1, y1
        return max(y0 + slope * (n - x0), 0.0)


@dataclass
class AffineFit:
    """measured ≈ scale · calibrated + offset, fitted online: exponentially weighted least squares
    (each step weighs REFRESH), shrunk towards a pure scale (offset 0) while the calibrated values
    seen vary little. A load that slows everything shows as a scale; a fixed cost the calibration
    did not see (a longer prefix, the walk) as an offset, which a scale would wrongly multiply."""

    w: float = 0.0  # weighted sums of 1, x, y, x², xy (x: calibrated seconds, y: measured)
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, weight: float) -> None:
        keep = 1.0 - weight
        self.w, self.x, self.y = keep * self.w + weight, keep * self.x + weight * x, keep * self.y + weight * y
        self.xx, self.xy = keep * self.xx + weight * x * x, keep * self.xy + weight * x * y

    def solve(self, spread: float = 0.25) -> tuple[float, float]:
        """(scale, offset). The slope is trusted in proportion var(x) / (var(x) + (spread · mean x)²)."""
        if self.w <= 0 or self.x <= 0:
            return 1.0, 0.0
        mx, my = self.x / self.w, self.y / self.w
        var = max(self.xx / self.w - mx * mx, 0.0)
        ratio = my / mx
        trust = var / (var + (spread * mx) ** 2)
        slope = (self.xy / self.w - mx * my) / var if var > 0 else ratio
        scale = min(max(trust * slope + (1 - trust) * ratio, 0.25 * ratio), 4.0 * ratio)
        return scale, my - scale * mx


@dataclass
class LatencyModel:
    """Measured costs of one step's pieces, in seconds, refreshed from every step."""

    verify: LatencyTable  # T(n): one target forward over the root and n tree nodes
    layer: LatencyTable | None = None  # one drafter.expand() over w nodes; None: not measured yet
    root_seconds: float = 0.0  # drafter.root_probs(): the catch-up at a step's start
    verify_scale: float = 1.0  # online corrections: measured T(n) ≈ verify_scale · table + verify_offset
    verify_offset: float = 0.0
    layer_scale: float = 1.0  # measured c(w) ≈ layer_scale · table
    verify_fit: AffineFit = dataclasses.field(default_factory=AffineFit)
    # running mean of the verified tree sizes per tree setting (sets the width cap); see AutoPolicy
    mean_sizes: dict = dataclasses.field(default_factory=dict)
    overhead: float = 0.0  # the rest of a step (cache surgery, commit, stopping criteria), learnt

    def verify_time(self, n: float) -> float:
        return max(self.verify.at(n) * self.verify_scale + self.verify_offset, 0.0)

    def step_times(self, m: int) -> torch.Tensor:
        """[m] float64: T(1) … T(m), each plus the rest of a step (overhead)."""
        return torch.tensor([self.verify_time(k) + self.overhead for k in range(1, m + 1)], dtype=torch.float64)

    def layer_time(self, width: int) -> float:
        """c(w): one draft forward expanding ``width`` nodes (0 while unmeasured)."""
        return 0.0 if self.layer is None else self.layer.at(width) * self.layer_scale

    def observe(self, step) -> None:
        """Refresh from one finished step (a StepStats)."""
        calibrated = self.verify.at(step.tree_size)
        if step.verify_seconds > 0 and calibrated > 0:
            if self.verify_fit.w == 0:  # the calibration itself is the prior: weight 1, at this size
                self.verify_fit.add(calibrated, calibrated, 1.0)
            self.verify_fit.add(calibrated, calibrated * _clip(step.verify_seconds / calibrated), REFRESH)
            self.verify_scale, self.verify_offset = self.verify_fit.solve()
        for layer in step.layers:
            if layer.seconds <= 0:
                continue
            if self.layer is None:  # an unmeasured drafter: a constant cost per layer, from now on refreshed
                self.layer = LatencyTable((layer.width,), (layer.seconds,))
                continue
            predicted = self.layer.at(layer.width)
            if predicted > 0:
                self.layer_scale += REFRESH * (_clip(layer.seconds / predicted) - self.layer_scale)
        if step.root_seconds > 0:
            self.root_seconds += REFRESH * (step.root_seconds - self.root_seconds)


def _clip(ratio: float) -> float:
    return min(max(ratio, 0.25), 4.0)  # one outlier step moves a scale at most this far


# ---------------------------------------------------------------------------------------------
# the decisions, as small pure functions


def expected_speed(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float,
                   cap: int | None = None) -> torch.Tensor:
    """speed(m) for m = 1 … min(len, cap): (E_m + 1) / (T(m) + D).

    path_probs: [k] float, any order (the m largest are summed).
    returns:    [min(k, cap)] float64, entry m - 1 is speed(m).
    """
    ranked = torch.sort(path_probs.double().cpu(), descending=True).values[:cap]
    gain = torch.cumsum(ranked, 0) + 1.0  # [k]
    return gain / (latency.step_times(len(ranked)) + draft_seconds)


def best_choice(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float,
                cap: int | None = None) -> tuple[int, float]:
    """(m, speed(m)) for the m in 0 … min(len, cap) that maximises speed(m). m = 0 verifies the
    root alone, speed(0) = 1 / (T(0) + D): where verifying even one node costs more than its E(A)
    is worth (a weak draft on a CPU), a step falls back to what plain decoding does."""
    alone = 1.0 / (latency.verify_time(0) + latency.overhead + draft_seconds)
    if len(path_probs) == 0:
        return 0, alone
    speed = expected_speed(path_probs, latency, draft_seconds, cap)
    m = int(torch.argmax(speed)) + 1  # first maximum: the smaller tree on ties
    return (m, float(speed[m - 1])) if float(speed[m - 1]) > alone else (0, alone)


def best_size(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float, cap: int | None = None) -> int:
    """The m (0 <= m <= cap) that maximises speed(m) (see :func:`best_choice`)."""
    return best_choice(path_probs, latency, draft_seconds, cap)[0]


def next_layer_guess(state: LayerState, cap: int | None = None) -> torch.Tensor:
    """The p̂ the next layer would add, guessed from the last one: each of the ``next_width`` most
    probable last-layer nodes gets children whose q (child p̂ / parent p̂) by rank is the last
    layer's mean q by rank (exact for a draft whose q looks alike everywhere).

    returns: [<= cap] float64, descending.
    """
    probs = state.path_probs.double().cpu()
    parents = state.parents.cpu()
    last = torch.arange(state.previous, len(probs))
    if len(last) == 0:
        return probs.new_zeros(0)
    parent_probs = torch.where(parents[last] >= 0, probs[parents[last].clamp(min=0)], probs.new_ones(len(last)))
    ratios = probs[last] / parent_probs  # [k]: the q of each last-layer node
    groups = [torch.sort(ratios[parents[last] == p], descending=True).values for p in torch.unique(parents[last])]
    width = max(len(g) for g in groups)
    profile = torch.stack([torch.nn.functional.pad(g, (0, width - len(g))) for g in groups]).mean(0)  # [width]
    frontier = torch.sort(probs[last], descending=True).values[:state.next_width]  # [w]
    guess = torch.sort((frontier[:, None] * profile[None, :]).flatten(), descending=True).values
    return guess[:cap]


def layer_pays(state: LayerState, latency: LatencyModel, draft_seconds: float, cap: int | None = None) -> bool:
    """Draft one more layer? Yes if the best expected speed with it (its p̂ guessed by
    :func:`next_layer_guess`, its cost c(w) added to the drafting time) beats the best speed now;
    in OPT-Tree's terms, while the layer's E(A) gain per second of drafting beats the current rate."""
    if len(state.path_probs) == 0 or state.next_width < 1:
        return False
    _, now = best_choice(state.path_probs, latency, draft_seconds, cap)
    grown = torch.cat([state.path_probs.double().cpu(), next_layer_guess(state, cap)])
    _, later = best_choice(grown, latency, draft_seconds + latency.layer_time(state.next_width), cap)
    return later > now


def layer_width(mean_size: float, max_nodes: int) -> int:
    """The layer width cap: about WIDTH_PER_NODE × the recent tree size, never the whole budget
    (at most half of it), at least MIN_WIDTH (or the budget, when smaller)."""
    return max(min(MIN_WIDTH, max_nodes), min(round(WIDTH_PER_NODE * mean_size), max_nodes // 2))


class AutoPolicy:
    """``nodes="auto"`` and/or ``threshold="auto"`` against a measured :class:`LatencyModel`."""

    def __init__(self, config: TreeConfig, latency: LatencyModel, clock: Callable[[], float] = time.perf_counter):
        """clock: seconds, for the step's drafting time so far (tests pass a fake machine's)."""
        self.config = config
        self.latency = latency
        self.clock = clock
        self.auto_nodes = config.nodes == "auto"
        self.auto_threshold = config.threshold == "auto"
        self.max_nodes = AUTO_MAX_NODES if self.auto_nodes else config.nodes
        self.threshold = 0.0 if self.auto_threshold else config.threshold  # with "auto", `grow` decides
        self._start = clock()
        # the recent tree size, shared by later calls with the same settings (not by other settings)
        self.setting = f"{config.strategy}/{config.nodes}/{config.threshold}/{config.max_depth}"
        self.mean_size = latency.mean_sizes.get(self.setting, START_SIZE)

    def spent(self) -> float:
        """Seconds since the step's plan: its drafting time so far."""
        return self.clock() - self._start

    def plan(self) -> StepPlan:
        self._start = self.clock()
        return StepPlan(
            nodes=self.max_nodes,
            threshold=self.threshold,
            width=layer_width(self.mean_size, self.max_nodes),
            grow=self._grow if self.auto_threshold else None,
            size=self._size if self.auto_nodes else None,
        )

    def _grow(self, state: LayerState) -> bool:
        return layer_pays(state, self.latency, self.spent(), self.max_nodes)

    def _size(self, path_probs: torch.Tensor) -> int:
        return best_size(path_probs, self.latency, self.spent(), self.max_nodes)

    def observe(self, step) -> None:
        rest = self.spent() - step.draft_seconds - step.verify_seconds  # since plan(): the whole step
        self.latency.overhead += REFRESH * (max(rest, 0.0) - self.latency.overhead)
        self.latency.observe(step)
        if step.tree_size > 0:
            self.mean_size += SIZE_REFRESH * (step.tree_size - self.mean_size)
            self.latency.mean_sizes[self.setting] = self.mean_size


# ---------------------------------------------------------------------------------------------
# calibration: measuring, fingerprints, the on-disk cache

_PAIRS: dict[str, LatencyModel] = {}  # key digest -> the process's (refreshed) model of that pair


def known_latency(target, drafter=None) -> LatencyModel | None:
    """This process's (refreshed) LatencyModel of the pair, if it was calibrated; else None."""
    prefix = calibration_prefix(target, drafter)
    return None if prefix is None else _PAIRS.get(_digest(calibration_key(target, drafter, prefix)))


def clear_calibrations() -> None:
    """Forget this process's calibrations (the on-disk cache stays)."""
    _PAIRS.clear()


def model_fingerprint(model) -> dict:
    """What a model's latency depends on: class, name_or_path, a hash of its config (of its module
    tree for a plain torch module), size, device and dtype (not its weights)."""
    config = getattr(model, "config", None)
    name = getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "")
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else str(model)
    first = next(model.parameters(), None)
    return {
        "class": type(model).__name__,
        "name": str(name),
        "config": hashlib.sha256(text.encode()).hexdigest()[:16],
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(getattr(model, "device", None) or (first.device if first is not None else "")),
        "dtype": str(getattr(model, "dtype", None) or (first.dtype if first is not None else "")),
    }


def _is_drafter(obj) -> bool:
    return all(hasattr(obj, name) for name in ("root_probs", "expand", "commit"))


def drafter_fingerprint(drafter, depth: int = 2) -> dict | None:
    """A drafter's class, the models it holds and the drafters it wraps (two levels deep)."""
    if drafter is None:
        return None
    parts = vars(drafter) if hasattr(drafter, "__dict__") else {}
    models = {k: model_fingerprint(v) for k, v in sorted(parts.items()) if isinstance(v, torch.nn.Module)}
    inner = {k: drafter_fingerprint(v, depth - 1) for k, v in sorted(parts.items())
             if depth > 0 and _is_drafter(v) and not isinstance(v, torch.nn.Module)}
    scalars = {k: v for k, v in sorted(parts.items()) if not k.startswith("_") and isinstance(v, (int, float, str))
               and k not in ("forwards", "prefix_len", "context_length")}  # settings, not running state
    return {"class": f"{type(drafter).__module__}.{type(drafter).__qualname__}", "models": models,
            "inner": inner, "settings": scalars}


def calibration_key(target, drafter, prefix: int = CALIBRATION_PREFIX) -> dict:
    """Everything a calibration depends on; its hash names the cache file."""
    return {
        "version": CALIBRATION_VERSION,
        "target": model_fingerprint(target),
        "drafter": drafter_fingerprint(drafter),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "weight_major": fast_linear.mode(),  # the few-row linear kernel (fast_linear): auto, on or off
        "verify_sizes": list(VERIFY_SIZES),
        "draft_widths": list(DRAFT_WIDTHS),
        "prefix": prefix,
    }


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """``$OPTTREE_CALIBRATION_DIR``, else ``$OPTTREE_CACHE/calibration`` (``~/.cache/opttree/calibration``)."""
    if os.environ.get("OPTTREE_CALIBRATION_DIR"):
        return Path(os.environ["OPTTREE_CALIBRATION_DIR"])
    return Path(os.environ.get("OPTTREE_CACHE", Path.home() / ".cache" / "opttree")) / "calibration"


def cache_mode() -> str:
    """``OPTTREE_CALIBRATION``: "on" (default: read, else measure and write), "off" (always
    measure, never touch the disk), "refresh" (measure and overwrite)."""
    mode = os.environ.get("OPTTREE_CALIBRATION", "on").strip().lower() or "on"
    if mode not in ("on", "off", "refresh"):
        raise ValueError(f"OPTTREE_CALIBRATION must be 'on', 'off' or 'refresh', got {mode!r}")
    return mode


def to_json(latency: LatencyModel) -> dict:
    layer = None if latency.layer is None else dataclasses.asdict(latency.layer)
    return {"verify": dataclasses.asdict(latency.verify), "layer": layer, "root_seconds": latency.root_seconds}


def from_json(data: dict) -> LatencyModel:
    def table(d):
        return None if d is None else LatencyTable(tuple(d["sizes"]), tuple(float(s) for s in d["seconds"]))

    return LatencyModel(verify=table(data["verify"]), layer=table(data["layer"]), root_seconds=float(data["root_seconds"]))


def read_cached(key: dict, folder: Path) -> LatencyModel | None:
    path = folder / f"{_digest(key)}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("key") != json.loads(json.dumps(key)):  # a hash collision or a stale format
            return None
        return from_json(data["latency"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(key: dict, latency: LatencyModel, folder: Path) -> Path | None:
    path = folder / f"{_digest(key)}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "latency": to_json(latency)}, indent=1))
        tmp.replace(path)  # atomic: a concurrent reader never sees half a file
        return path
    except OSError as error:
        logger.warning("could not write the calibration cache %s: %s", path, error)
        return None


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def measure_verify(target, sizes=VERIFY_SIZES, prefix: int = CALIBRATION_PREFIX,
                   repeats: int = REPEATS) -> tuple[float, ...]:
    """T(n) for each n in ``sizes``: one target forward over a root and n tree nodes (children of
    the root) on a ``prefix``-token cache, cropped back after each. The sizes take turns within
    each round, so a burst of load hits them alike; the first round warms up; medians."""
    from . import kv_cache

    device, vocab = target.device, int(target.get_input_embeddings().weight.shape[0])
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.inference_mode():
        cache = kv_cache.new_cache(target)
        ids = (torch.arange(prefix, dtype=torch.long) * 7 % vocab)[None, :].to(device)
        target(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        inputs = {}
        for n in sizes:
            tree = DraftTree((torch.arange(n, dtype=torch.long) % vocab).to(device),
                             torch.full((n,), -1, dtype=torch.long, device=device), torch.ones(n, device=device))
            inputs[n] = verification_inputs(1, tree, prefix, target.dtype).as_kwargs()
        for round_ in range(repeats + 1):
            for n in sizes:
                start = time.perf_counter()
                target(**inputs[n], past_key_values=cache, use_cache=True, logits_to_keep=0)
                _sync(device)
                if round_ > 0:
                    times[n].append(time.perf_counter() - start)
                kv_cache.keep_slots(cache, prefix, torch.empty(0, dtype=torch.long, device=device))
    return tuple(_median(times[n]) for n in sizes)


def measure_drafter(drafter, vocab: int, device, widths=DRAFT_WIDTHS, prefix: int = CALIBRATION_PREFIX,
                    repeats: int = REPEATS, hidden_size: int | None = None) -> tuple[float, tuple[float, ...]]:
    """Time a (scratch) drafter through its protocol: (root_probs seconds, expand seconds per width).

    Each round commits one more token (``root_probs``: the catch-up of a step), expands ``w``
    children of the root in ONE call, and commits none of them, exactly as a step that accepts
    nothing. A drafter that ``wants_hidden_states`` is handed zero features [n, hidden_size] where
    the decoding loop would hand the target's. The first round warms up; medians of the rest."""
    sequence = (torch.arange(prefix, dtype=torch.long) * 7 % vocab).to(device)
    roots: list[float] = []
    layers: dict[int, list[float]] = {w: [] for w in widths}

    def features(n: int) -> None:  # as generation.py: the prompt's but the root's, then 1 + accepted per step
        if getattr(drafter, "wants_hidden_states", False):
            drafter.add_features(torch.zeros(n, hidden_size, device=device))

    with torch.inference_mode():
        features(prefix - 1)
        drafter.root_probs(sequence)  # the prefill
        for round_ in range(repeats + 1):
            for w in widths:
                token = torch.tensor([(len(sequence) * 5 + 1) % vocab], dtype=torch.long, device=device)
                sequence = torch.cat([sequence, token])
                features(1)
                start = time.perf_counter()
                q = drafter.root_probs(sequence)
                _sync(q.device)
                root_end = time.perf_counter()
                top = torch.topk(q.float(), min(w, q.shape[-1])).indices.to(device)
                pool = DraftTree(top, torch.full_like(top, -1), torch.ones(len(top), device=device))
                frontier = torch.arange(len(top), device=device)
                expand_start = time.perf_counter()
                out = drafter.expand(pool, frontier)
                _sync(out.device)
                end = time.perf_counter()
                drafter.commit([])
                if round_ > 0:
                    roots.append(root_end - start)
                    layers[w].append(end - expand_start)
    return _median(roots), tuple(_median(layers[w]) for w in widths)


def lower_envelope(times) -> tuple[float, ...]:
    """T(n) := min over m >= n of the measured T(m): non-decreasing in n, and robust to spikes
    (a busy machine only ever adds time to a measurement)."""
    out, low = [], float("inf")
    for t in reversed(list(times)):
        low = min(low, t)
        out.append(low)
    return tuple(reversed(out))


def measure(target, new_drafter: Callable[[], object] | None, prefix: int = CALIBRATION_PREFIX) -> LatencyModel:
    """A fresh LatencyModel: T(n) on the target; the drafter through a scratch one from
    ``new_drafter()`` (without one, or if timing it fails, the draft cost is learnt from the steps)."""
    from .validation import vocab_size

    verify = LatencyTable(VERIFY_SIZES, lower_envelope(measure_verify(target, prefix=prefix)))
    latency = LatencyModel(verify=verify)
    if new_drafter is not None:
        try:
            text = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
            root, layers = measure_drafter(new_drafter(), vocab_size(target), target.device, prefix=prefix,
                                           hidden_size=getattr(text, "hidden_size", None))
        except Exception as error:  # a drafter that cannot run on synthetic text: learn online instead
            logger.warning("could not time the drafter (%s: %s); learning its cost from the steps",
                           type(error).__name__, error)
        else:
            latency.layer = LatencyTable(DRAFT_WIDTHS, lower_envelope(layers))
            latency.root_seconds = root
    logger.info("calibration at %d tokens: %s; draft layer %s", prefix,
                ", ".join(f"T({n})={t * 1e3:.1f}ms" for n, t in zip(verify.sizes, verify.seconds)),
                "unmeasured" if latency.layer is None else
                ", ".join(f"c({w})={t * 1e3:.1f}ms" for w, t in zip(latency.layer.sizes, latency.layer.seconds)))
    return latency


def calibrate(target, drafter=None, new_drafter: Callable[[], object] | None = None, *,
              folder: Path | None = None, mode: str | None = None, prefix: int | None = None) -> LatencyModel:
    """The LatencyModel of this (target, drafter) pair on this machine: from this process's
    memory, else from the on-disk cache, else measured (and written). ``drafter`` names the pair
    (its fingerprint), ``new_drafter()`` makes a scratch drafter to time. ``folder`` / ``mode``
    default to :func:`cache_dir` / :func:`cache_mode`, ``prefix`` to :func:`calibration_prefix`.
    Every generate() call of the process shares (and refreshes) the returned object."""
    mode = mode or cache_mode()
    folder = folder or cache_dir()
    prefix = prefix or calibration_prefix(target, drafter)
    if prefix is None:
        raise ValueError(f"nodes/threshold='auto' needs a context of at least {MIN_CALIBRATION_PREFIX + _ROOM} "
                         f"tokens to calibrate")
    key = calibration_key(target, drafter, prefix)
    digest = _digest(key)
    if mode == "refresh" or digest not in _PAIRS:
        latency = read_cached(key, folder) if mode == "on" else None
        if latency is None:
            with fast_linear.weight_major(target, drafter):  # as the decoding loops run (integration.py)
                latency = measure(target, new_drafter, prefix)
            if mode != "off":
                write_cached(key, latency, folder)
        _PAIRS[digest] = latency
    return _PAIRS[digest]


_ROOM = max(max(VERIFY_SIZES), max(DRAFT_WIDTHS)) + (REPEATS + 1) * len(DRAFT_WIDTHS) + 2  # tokens past the prefix


def calibration_prefix(target, drafter=None) -> int | None:
    """The cached tokens under the timed forwards: CALIBRATION_PREFIX, less where the target's or
    the drafter's context is shorter; None where even MIN_CALIBRATION_PREFIX does not fit."""
    from .validation import context_length

    limits = [x for x in (context_length(target), getattr(drafter, "context_length", None)) if x]
    prefix = min([CALIBRATION_PREFIX] + [limit - _ROOM for limit in limits])
    return prefix if prefix >= MIN_CALIBRATION_PREFIX else None


def make_policy(config: TreeConfig, target, drafter=None, new_drafter: Callable[[], object] | None = None) -> BudgetPolicy:
    """The step policy for ``config``: :class:`FixedPolicy`, or for ``nodes``/``threshold="auto"``
    an :class:`AutoPolicy` calibrated on ``target`` and the drafter (see :func:`calibrate`)."""
    if config.nodes != "auto" and config.threshold != "auto":
        return FixedPolicy(config)
    return AutoPolicy(config, calibrate(target, drafter, new_drafter))


__all__ = ["AUTO_MAX_NODES", "AutoPolicy", "BudgetPolicy", "FixedPolicy", "LatencyModel", "LatencyTable",
           "LayerState", "StepPlan", "best_choice", "best_size", "calibrate", "clear_calibrations", "known_latency",
           "expected_speed", "layer_pays", "layer_width", "make_policy"]
