"""``opttree distill --kind eagle3``: the target's answers (cached by :mod:`opttree.distill.data.answers`)
-> the features of the three taps, in their own cache folder ``<cache>/features-eagle3`` (``--kind
head``'s ``<cache>/features`` is left as it is) -> :func:`.train.train_eagle3` -> an EAGLE-3 folder.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from ...drafters.head.eagle import default_taps
from ...hf.width import text_config
from ..data.features import answer_marker, extract_features, load_features, unique_sequences
from .train import Eagle3TrainConfig, train_eagle3

logger = logging.getLogger("opttree.distill")
FEATURES_FOLDER = "features-eagle3"


def eagle3_features(target, records: list[dict], cache: Path, topk: int, seed: int) -> Path:
    """The answers' texts' features of the taps (2, L//2, L-3), resumable, under ``cache``."""
    sequences = unique_sequences(records, 1024)
    random.Random(seed).shuffle(sequences)
    taps = default_taps(text_config(target.config).num_hidden_layers)
    return extract_features(target, sequences, cache / FEATURES_FOLDER, topk=topk, layers=taps)


def run_eagle3(target, tokenizer, records: list[dict], cache: Path, args) -> int:
    """The CLI's ``--kind eagle3`` after the data step (``args``: the parsed ``opttree distill`` flags)."""
    folder = eagle3_features(target, records, Path(cache), min(args.topk, 16), args.seed)
    cfg = Eagle3TrainConfig(
        draft_vocab_size=args.kept_tokens, unroll=args.unroll, epochs=args.epochs, batch_tokens=args.batch_tokens,
        max_len=args.max_len, lr=args.lr, max_minutes=args.max_minutes, eval_every=args.eval_every, seed=args.seed,
        save_dtype=args.save_dtype, answers_only=args.answers_only)
    result = train_eagle3(target, load_features(folder), args.out, cfg, answer_marker(tokenizer))
    logger.info("EAGLE-3 head saved to %s: val agreement by depth %s after %d steps (%.1f min, %d tokens)",
                result.path, " ".join(f"{a:.3f}" for a in result.val_agreement), result.steps,
                result.seconds / 60, result.train_tokens)
    return 0


__all__ = ["FEATURES_FOLDER", "eagle3_features", "run_eagle3"]
