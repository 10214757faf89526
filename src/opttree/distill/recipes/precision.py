"""Which precision is fast on this machine, measured, never assumed (``opttree distill --precision``).

bf16 here means autocast to bfloat16 with float32 master weights; fp32 means plain float32.
Which is faster depends on the machine, not on what its CPU flags promise: bf16 matmuls are
several times faster than float32 on CPUs with AMX and on GPUs, several times SLOWER on CPUs
whose kernels fall back to emulation. So ``auto`` times a short probe of each precision on the
shapes the round will use and picks the faster one per stage:

- ``features``: one target forward over a text of ``feature_tokens`` positions, hidden states on
  (:func:`opttree.distill.data.features.features_of`);
- ``train``: one optimizer step of the head on a batch of ``train_tokens`` positions
  (:func:`opttree.distill.train.head_train.train_step`).

Each stage is scouted first at ``SCOUT_TOKENS`` positions (one warm-up and one timed call per
precision): a precision ``SCOUT_MARGIN`` times slower there than another is not timed at the full
shape, so a precision that is far slower (bf16 on an AVX2-only CPU, where its linears fall back to
a slow path) costs the probe seconds, not the minutes of three full-shape calls.

The choice is kept in ``<cache>/precision.json`` with the machine it was measured on, so a round
that resumes on the same machine keeps its precision (a flip caused by timing noise would start
a different features folder); on another machine it is measured again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from ...loading.machine import bf16_flags, cpu_model, machine_name  # noqa: F401 (their home before machine.py)
from ...loading.turns import take_turns

logger = logging.getLogger("opttree.distill")

PRECISIONS = ("fp32", "bf16")
STAGES = ("features", "train")
CHOICE_FILE = "precision.json"
SCOUT_TOKENS = 64  # positions per scouting call: where the AVX2 bf16 trap already shows (4x at 64 rows)
SCOUT_MARGIN = 2.5  # this many times slower at the scout's shape: not timed at the full shape


@dataclass(frozen=True)
class Probe:
    """One timed probe: ``calls`` calls of ``tokens`` positions each took ``seconds`` (warm-up excluded)."""

    stage: str  # "features" | "train"
    precision: str  # "fp32" | "bf16"
    tokens: int
    calls: int
    seconds: float
    scout: bool = False  # timed at the small scouting shape only (it lost there by SCOUT_MARGIN)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens * self.calls / max(self.seconds, 1e-12)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision of each stage, and the probes it was chosen from (none when it was named)."""

    features: str
    train: str
    probes: tuple[Probe, ...] = ()
    machine: str = ""
    how: str = "named"  # "named" (--precision fp32|bf16), "measured" or "kept" (from precision.json)

    def report(self) -> str:
        """What was measured and what was picked, one line per stage."""
        lines = [f"precision ({self.how}) on {self.machine or 'this machine'}:"]
        for stage in STAGES:
            rates = {p.precision: (p.tokens_per_second, p) for p in self.probes if p.stage == stage}
            measured = ", ".join(f"{k} {v:,.0f} tok/s" + (f" at {p.tokens} positions" if p.scout else "")
                                 for k, (v, p) in sorted(rates.items()))
            lines.append(f"  {stage}: {getattr(self, stage)}" + (f" ({measured})" if measured else ""))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"features": self.features, "train": self.train, "machine": self.machine,
                "probes": [asdict(p) | {"tokens_per_second": round(p.tokens_per_second, 1)} for p in self.probes]}


def choose(probes: list[Probe] | tuple[Probe, ...], machine: str = "") -> PrecisionChoice:
    """Per stage, the precision whose probe ran the most tokens per second at the full shape
    (a precision that lost the scouting has no full-shape probe); fp32 for a stage without any
    probe (a precision whose probe failed has none)."""
    picked = {}
    for stage in STAGES:
        full = [p for p in probes if p.stage == stage and not p.scout]
        rates = {p.precision: p.tokens_per_second for p in (full or [p for p in probes if p.stage == stage])}
        picked[stage] = max(rates, key=lambda k: (rates[k], k == "fp32")) if rates else "fp32"
    return PrecisionChoice(picked["features"], picked["train"], tuple(probes), machine, "measured")


def named(precision: str, machine: str = "") -> PrecisionChoice:
    """The choice ``--precision fp32|bf16`` makes: every stage in that precision."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} or 'auto', not {precision!r}")
    return PrecisionChoice(precision, precision, (), machine, "named")


def feature_probe(target, tokens: int, layers: tuple[int, ...], topk: int, bf16: bool) -> Callable[[], object]:
    """One target forward over ``tokens`` random positions with hidden states, as extraction runs it."""
    from ..data.features import features_of

    ids = torch.randint(0, target.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    return lambda: features_of(target, ids, topk, bf16, layers)


def train_probe(target, cfg, tokens: int, bf16: bool) -> Callable[[], object]:
    """One optimizer step of a head shaped as ``cfg`` (HeadTrainConfig; an Eagle3TrainConfig: an
    EAGLE-3 head's step, :func:`~..eagle3.train.step_probe`) on a random batch of ``tokens``
    positions (rows of ``cfg.max_len``), as training runs it."""
    from ..eagle3.train import Eagle3TrainConfig, step_probe
    from ..train.head_data import FeatureBatch

    if isinstance(cfg, Eagle3TrainConfig):
        return step_probe(target, cfg, tokens, bf16)
    from ..train.head import new_head
    from ..train.head_train import head_optimizer, kept_index, train_step

    vocab = target.config.vocab_size
    kept = torch.arange(min(cfg.num_kept_tokens, vocab))
    head, _ = new_head(target, kept, None, cfg.num_layers, tuple(cfg.feature_layers), cfg.out_rank)
    head = head.to(target.get_input_embeddings().weight.device).train()
    rows, length = max(1, tokens // cfg.max_len), min(tokens, cfg.max_len)
    g = torch.Generator().manual_seed(0)
    width, k = head.c.feature_width, 8
    batch = FeatureBatch(  # [B, L] tokens, [B, L, F] features, [B, L, k] soft labels
        tokens=torch.randint(0, vocab, (rows, length), generator=g),
        features=torch.randn(rows, length, width, generator=g),
        valid=torch.ones(rows, length, dtype=torch.bool),
        topk_ids=torch.randint(0, len(kept), (rows, length, k), generator=g),
        topk_logits=torch.randn(rows, length, k, generator=g).sort(-1, descending=True).values,
        answer=torch.ones(rows, length, dtype=torch.bool)).to(head.device)
    optim = head_optimizer(head, replace(cfg, lr=1e-6))
    step_cfg, full_to_kept = replace(cfg, bf16=bf16), kept_index(head)
    return lambda: train_step(head, optim, batch, step_cfg, full_to_kept, 1e-6)


def time_alternating(fns: dict[str, Callable[[], object]], seconds: float,
                     clock: Callable[[], float] = time.perf_counter, max_rounds: int = 1000,
                     warm_up: bool = True) -> dict[str, tuple[int, float]]:
    """``{name: (calls, seconds)}``: one warm-up call of each (not counted; ``warm_up=False``: the
    caller has made it), then rounds of one call of each in turn until each has run ``seconds``
    (at least one round). Taking turns makes a load that comes and goes on a shared machine slow
    every candidate alike."""
    for fn in fns.values() if warm_up else ():
        fn()

    def go_on(done: int, times: dict[str, list[float]]) -> bool:
        return done < max_rounds and not all(sum(ts) >= seconds for ts in times.values())

    return {name: (len(ts), sum(ts)) for name, ts in take_turns(fns, go_on, clock).items()}


def scout_losers(rates: dict[str, float], margin: float = SCOUT_MARGIN) -> set[str]:
    """The precisions whose scouting rate (tokens/s) is ``margin`` times below the best one's."""
    best = max(rates.values(), default=0.0)
    return {name for name, rate in rates.items() if rate * margin < best}


def runnable(makers: dict[str, Callable[[], Callable[[], object]]], stage: str) -> dict[str, Callable[[], object]]:
    """Each precision's probe, made and called once (its warm-up); a precision without kernels
    here fails at once and is left out."""
    fns = {}
    for precision, make in makers.items():
        try:
            fn = make()
            fn()
        except (RuntimeError, NotImplementedError) as error:
            logger.warning("%s in %s does not run here (%s): not a candidate", stage, precision, error)
            continue
        fns[precision] = fn
    return fns


def probe_round(target, train_cfg, layers: tuple[int, ...] = (-1,), seconds: float = 1.0,
                feature_tokens: int = 512, train_tokens: int = 2048, topk: int = 16,
                scout_tokens: int = SCOUT_TOKENS, clock: Callable[[], float] = time.perf_counter) -> list[Probe]:
    """Time both precisions on both stages, taking turns (about ``seconds`` each, plus a warm-up
    call), after a scouting call at ``scout_tokens`` positions that drops a precision
    ``SCOUT_MARGIN`` times slower (its scouting probe is kept, marked ``scout``). A precision that
    fails on this machine (no bf16 kernels) gets no probe."""
    def train_positions(tokens: int) -> int:
        return max(1, tokens // train_cfg.max_len) * min(tokens, train_cfg.max_len)

    makers = {"features": lambda bf16, n: feature_probe(target, n, layers, topk, bf16=bf16),
              "train": lambda bf16, n: train_probe(target, train_cfg, n, bf16=bf16)}
    full_tokens = {"features": feature_tokens, "train": train_tokens}
    out = []
    for stage, make in makers.items():
        small = min(scout_tokens, full_tokens[stage])
        fns = runnable({p: (lambda p=p: make(p == "bf16", small)) for p in PRECISIONS}, stage)
        timed = time_alternating(fns, 0.0, clock, warm_up=False)  # one call each
        size = small if stage == "features" else train_positions(small)
        scouts = {p: Probe(stage, p, size, calls, took, scout=True) for p, (calls, took) in timed.items()}
        rates = {p: probe.tokens_per_second for p, probe in scouts.items()}
        losers = scout_losers(rates)
        for precision in sorted(losers):
            logger.info("%s in %s: %.1fx slower at %d positions, not timed at %d", stage, precision,
                        max(rates.values()) / rates[precision], size, full_tokens[stage])
            out.append(scouts[precision])
        tokens = full_tokens[stage] if stage == "features" else train_positions(full_tokens[stage])
        fns = runnable({p: (lambda p=p: make(p == "bf16", full_tokens[stage])) for p in fns if p not in losers}, stage)
        for precision, (calls, took) in time_alternating(fns, seconds, clock, warm_up=False).items():
            out.append(Probe(stage, precision, tokens, calls, took))
    return out


def resolve(requested: str, device, cache: Path | None, measure: Callable[[], list[Probe]]) -> PrecisionChoice:
    """The precision of a round: ``fp32`` / ``bf16`` as named; ``auto``: the choice kept in
    ``cache/precision.json`` when it was measured on this machine, else ``measure()``'s (then kept)."""
    machine = machine_name(device)
    if requested != "auto":
        return named(requested, machine)
    path = cache / CHOICE_FILE if cache is not None else None
    if path is not None and path.exists():
        kept = json.loads(path.read_text())
        if kept.get("machine") == machine:
            return PrecisionChoice(kept["features"], kept["train"], tuple(
                Probe(**{k: p[k] for k in ("stage", "precision", "tokens", "calls", "seconds")},
                      scout=bool(p.get("scout", False)))
                for p in kept.get("probes", [])), machine, "kept")
    choice = choose(measure(), machine)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(choice.to_json(), indent=2) + "\n")
    return choice
