"""The recipe file of ``opttree distill --recipe``: what data, which stages, which seeds.

A TOML file (example: ``drafts/smollm2-135m-head/recipe.toml``)::

    name = "my-head"
    seed = 0
    target = "smollm2"            # "smollm2" (opttree.smollm2), or an HF / GGUF folder
    kind = "head"                 # "head": opttree's feature head; "eagle3": a head in the EAGLE-3 layout

    [[source]]                    # repeatable; each is cached in <cache>/sources/<name>
    name = "docs"
    kind = "answers"              # the target's greedy answers to prompts ...
    prompts = "documents"         # ... "selfmade" | "documents" | "chat" | a JSONL file (relative to the recipe)
    count = 512
    max_new_tokens = 96
    batch_size = 32

    [[source]]
    name = "passages"
    kind = "teacher"              # existing texts as the assistant turn: one target forward, no generation
    count = 400

    [features]
    layers = [-1]                 # target hidden states kept (HeadConfig.feature_layers)
    topk = 16
    bf16 = true
    max_len = 1024

    [[stage]]                     # trained in order; each is cached in <cache>/stages/<name>
    name = "a"
    init = ""                     # "" = a new head, "^" = the previous stage, else a head folder
    sources = []                  # [] = every source
    minutes = 10                  # wall-clock cap (the cosine schedule ends in time)
    epochs = 2
    lr = 1e-3
    # any other HeadTrainConfig field: unroll, batch_tokens, num_kept_tokens, answers_only,
    # num_layers, feature_layers, ...

The last stage is the shipped draft (copied to ``--out``).

``kind = "eagle3"`` trains a head in the EAGLE-3 layout itself (:mod:`opttree.distill.eagle3`), whose
folder vLLM and SGLang read as it is: ``[features] layers`` must be the target's default taps
(2, L//2, L-3; checked against the target when the recipe runs), a stage's fields are
:class:`~opttree.distill.eagle3.train.Eagle3TrainConfig`'s (``draft_vocab_size``, ``unroll``, ...;
a feature-head field is refused by name) and its ``init`` an EAGLE-3 folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..eagle3.train import Eagle3TrainConfig
from ..train.head_train import HeadTrainConfig

KINDS = {"head": HeadTrainConfig, "eagle3": Eagle3TrainConfig}  # the recipe's kind -> its stages' training config
TOP_KEYS = {"name", "seed", "target", "kind", "source", "features", "stage"}


@dataclass(frozen=True)
class Source:
    name: str
    kind: str  # "answers" (generation) or "teacher" (teacher-forced texts)
    count: int
    prompts: str = "selfmade"  # answers: "selfmade" | "documents" | "chat" | JSONL path
    max_new_tokens: int = 128
    batch_size: int = 32
    max_prompt_tokens: int = 768
    topk: int = 16
    bf16: bool = False  # answers: generate under bf16 autocast (the greedy answers of a bf16 target)
    seed: int | None = None  # default: the recipe's


@dataclass(frozen=True)
class FeatureSpec:
    layers: tuple[int, ...] = (-1,)
    topk: int = 16
    bf16: bool = True
    max_len: int = 1024
    shard_size: int = 32


@dataclass(frozen=True)
class Stage:
    name: str
    init: str = ""  # "" new head, "^" the previous stage, else a head folder (relative to the recipe)
    sources: tuple[str, ...] = ()  # () = all
    minutes: float | None = None
    train: dict = field(default_factory=dict)  # the kind's training config fields (KINDS)


@dataclass(frozen=True)
class Recipe:
    name: str
    target: str
    seed: int
    sources: tuple[Source, ...]
    features: FeatureSpec
    stages: tuple[Stage, ...]
    base: Path  # the recipe file's folder: relative paths in it start there
    kind: str = "head"  # a key of KINDS

    def train_config(self, stage: Stage) -> HeadTrainConfig | Eagle3TrainConfig:
        fields = dict(stage.train)
        fields.setdefault("seed", self.seed)
        fields.setdefault("max_len", min(512, self.features.max_len))
        if "feature_layers" in fields:
            fields["feature_layers"] = tuple(fields["feature_layers"])
        return KINDS[self.kind](**fields, max_minutes=stage.minutes)

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)

    def stage_sources(self, stage: Stage) -> tuple[Source, ...]:
        return tuple(self.source(n) for n in stage.sources) if stage.sources else self.sources


def _only(cls, raw: dict, where: str) -> dict:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    return raw


def parse_recipe(raw: dict, base: Path) -> Recipe:
    """A :class:`Recipe` from the TOML's dict; unknown keys are errors (a typo must not pass)."""
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown top-level keys {unknown} (known: {sorted(TOP_KEYS)})")
    seed = int(raw.get("seed", 0))
    sources = tuple(Source(**_only(Source, s, f"source {s.get('name')}")) for s in raw.get("source", []))
    names = [s.name for s in sources]
    if not names:
        raise ValueError("a recipe needs a [[source]] (what its texts answer; a round given --texts reads those "
                         "instead, but its recipe still names what they answer): add one, e.g. round-cpu.toml's")
    if len(set(names)) != len(names):
        raise ValueError(f"sources need unique names (got {names})")
    for s in sources:
        if s.kind not in ("answers", "teacher"):
            raise ValueError(f"source {s.name}: kind must be 'answers' or 'teacher', not {s.kind!r}")
    feats = dict(raw.get("features", {}))
    if "layers" in feats:
        feats["layers"] = tuple(feats["layers"])
    features = FeatureSpec(**_only(FeatureSpec, feats, "features"))
    kind = str(raw.get("kind", "head"))
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, not {kind!r}")
    stages = []
    train_fields = {f.name for f in dataclasses.fields(KINDS[kind])} - {"max_minutes"}
    for s in raw.get("stage", []):
        s = dict(s)
        head = {k: s.pop(k) for k in list(s) if k in train_fields}
        stage_fields = {f.name for f in dataclasses.fields(Stage)} - {"train"}
        unknown = sorted(set(s) - stage_fields)
        if unknown:
            raise ValueError(f"stage {s.get('name')}: unknown keys {unknown} for a recipe of kind {kind!r} (a stage "
                             f"takes {sorted(stage_fields)} and {KINDS[kind].__name__}'s fields: {sorted(train_fields)})")
        stage = Stage(**{**s, "sources": tuple(s.get("sources", ())), "train": head})
        missing = set(stage.sources) - set(names)
        if missing:
            raise ValueError(f"stage {stage.name}: unknown sources {sorted(missing)}")
        want = tuple(head.get("feature_layers", (-1,))) if kind == "head" else ()
        if any(i not in features.layers for i in want):
            raise ValueError(f"stage {stage.name} reads target layers {want}; [features] layers keeps {features.layers}")
        stages.append(stage)
    if not stages:
        raise ValueError("a recipe needs at least one [[stage]]")
    return Recipe(raw.get("name", "draft"), str(raw.get("target", "smollm2")), seed, sources, features,
                  tuple(stages), base, kind)


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    return parse_recipe(tomllib.loads(path.read_text()), path.resolve().parent)


def fingerprint(obj) -> str:
    """A short stable hash of a dataclass (or any JSON-able value): what a cache entry was made by."""
    def plain(x):
        if dataclasses.is_dataclass(x):
            return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x) if f.name != "base"}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x if isinstance(x, (int, float, str, bool, type(None))) else str(x)
    return hashlib.sha256(json.dumps(plain(obj), sort_keys=True).encode()).hexdigest()[:16]
