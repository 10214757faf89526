"""A round's texts as data to commit: the prompts, and the target's greedy answers as token ids, in
compact shards that a later run on another machine goes on from (issue 58, item 1).

A folder (``drafts/<head>/data`` for a shipped head) holds::

    texts.json               the format, and the settings every shard was made by (:class:`TextSettings`)
    prompts.jsonl.gz         every prompt of the round, in the order they are answered
    texts_00000.safetensors  batch 0: ``ids`` [T] uint16 (each text's prompt then answer, end to end),
                             ``starts`` [n + 1] int64 (text i is ids[starts[i]:starts[i + 1]]),
                             ``prompt_lens`` [n] int32, ``prompt_index`` [n] int32 (its line in prompts.jsonl.gz)

Batch ``b`` answers prompts ``b * batch_size ...`` of the file, left-padded together; a shard that
exists is skipped, so a run resumes where any earlier one stopped, here or elsewhere. Features and
labels are not stored: the target recomputes them from the ids (one forward per text).

Settings are never mixed: a folder made by other settings (another target, generation dtype,
answer length, batch size or prompts) is refused by name, before any generation. The target is
known by :func:`target_identity` (its config and a hash of its embedding and final norm), so a
target loaded another way that computes the same function is the same target.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .answers import DataConfig, answer_batch, chat_ids
from .prompts import Prompt, read_jsonl_prompts, write_jsonl_prompts

logger = logging.getLogger(__name__)
FORMAT = "opttree-texts/1"
INDEX_FILE, PROMPTS_FILE = "texts.json", "prompts.jsonl.gz"
MAX_ID = 65535  # ids are stored as uint16


@dataclass(frozen=True)
class TextSettings:
    """What every shard of a folder was made by."""

    target: str  # :func:`target_identity`
    dtype: str = "bfloat16"  # the dtype the target answered in ("bfloat16": its weights cast)
    max_new_tokens: int = 128
    max_prompt_tokens: int = 512
    batch_size: int = 96


def target_identity(target) -> str:
    """A short hash of the target's config and of its input embedding and final norm weights."""
    h = hashlib.sha256(target.config.to_json_string(use_diff=False).encode())
    h.update(target.get_input_embeddings().weight.detach().float().cpu().numpy().tobytes())
    for name, p in target.named_parameters():
        if name.endswith("norm.weight") and name.count(".") <= 2:  # the final norm (model.norm.weight)
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def shard_file(b: int) -> str:
    return f"texts_{b:05d}.safetensors"


def open_folder(folder: Path, settings: TextSettings, prompts: list[Prompt] | None) -> list[Prompt]:
    """The folder's prompts, the folder made if new (``prompts`` written); refused where its settings
    or prompts differ from the run's."""
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / INDEX_FILE
    if not index.exists():
        if prompts is None:
            raise ValueError(f"{folder}: no {INDEX_FILE}: it holds no texts; give the prompts to answer")
        write_jsonl_prompts(prompts, folder / PROMPTS_FILE)
        index.write_text(json.dumps({"format": FORMAT, "settings": asdict(settings)}, indent=1) + "\n")
        return prompts
    raw = json.loads(index.read_text())
    if raw.get("format") != FORMAT:
        raise ValueError(f"{index}: format {raw.get('format')!r}, this opttree reads {FORMAT!r}")
    theirs = TextSettings(**raw["settings"])
    if theirs != settings:
        diff = {k: (v, getattr(settings, k)) for k, v in asdict(theirs).items() if v != getattr(settings, k)}
        raise ValueError(f"{folder} was made by other settings ({', '.join(f'{k}: {a!r} there, {b!r} here' for k, (a, b) in diff.items())}): "
                         "texts of different settings are never mixed; use another folder, or this folder's settings")
    stored = read_jsonl_prompts(folder / PROMPTS_FILE)
    if prompts is not None and [(p.text, p.kind) for p in prompts] != [(p.text, p.kind) for p in stored]:
        raise ValueError(f"{folder} holds other prompts than the run's: texts of different prompts are never "
                         "mixed; use another folder, or none (its own prompts are then answered)")
    return stored


def pack(texts: list[list[int]], prompt_lens: list[int], index: list[int]) -> dict[str, torch.Tensor]:
    """One shard's tensors (module doc)."""
    flat = [t for text in texts for t in text]
    if flat and max(flat) > MAX_ID:
        raise ValueError(f"token id {max(flat)} does not fit the shards' uint16 (vocabularies up to {MAX_ID + 1})")
    starts = torch.tensor([0, *torch.tensor([len(t) for t in texts]).cumsum(0).tolist()], dtype=torch.int64)
    return {"ids": torch.tensor(flat, dtype=torch.int32).to(torch.uint16), "starts": starts,  # [T], [n + 1]
            "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32),  # [n]
            "prompt_index": torch.tensor(index, dtype=torch.int32)}  # [n]


def unpack(tensors: dict[str, torch.Tensor]) -> list[dict]:
    """Records ``{"input_ids" [L] long, "prompt_len", "prompt_index"}`` of one shard."""
    ids, starts = tensors["ids"].to(torch.int64), tensors["starts"].tolist()
    return [{"input_ids": ids[starts[i]:starts[i + 1]].clone(), "prompt_len": int(n), "prompt_index": int(j)}
            for i, (n, j) in enumerate(zip(tensors["prompt_lens"].tolist(), tensors["prompt_index"].tolist()))]


def answer_texts(target, tokenizer, folder: str | Path, settings: TextSettings, prompts: list[Prompt] | None = None,
                 deadline: float | None = None, max_batches: int | None = None) -> int:
    """Answer the folder's prompts batch by batch into shards, skipping the shards there, until every
    batch is done, ``max_batches`` new ones are, or ``deadline`` (time.time()) passed. ``target``
    answers in its own dtype, which must be ``settings.dtype``. Returns the batches written."""
    from safetensors.torch import save_file

    folder = Path(folder)
    dtype = str(target.dtype).removeprefix("torch.")
    if dtype != settings.dtype:
        raise ValueError(f"the target answers in {dtype}, the folder's texts are {settings.dtype} answers: "
                         f"cast it (target.to(torch.{settings.dtype})) or use another folder")
    prompts = open_folder(folder, settings, prompts)
    cfg = DataConfig(max_new_tokens=settings.max_new_tokens, batch_size=settings.batch_size, topk=1,
                     max_prompt_tokens=settings.max_prompt_tokens)
    size = settings.batch_size
    written, start, tokens = 0, time.time(), 0
    for b in range((len(prompts) + size - 1) // size):
        if (folder / shard_file(b)).exists():
            continue
        if (max_batches is not None and written >= max_batches) or (deadline is not None and time.time() > deadline):
            break
        index = list(range(b * size, min(len(prompts), (b + 1) * size)))
        ids = [chat_ids(tokenizer, prompts[i].text)[-settings.max_prompt_tokens:] for i in index]
        samples = answer_batch(target, tokenizer, ids, cfg, with_logits=False)
        tensors = pack([s.input_ids.tolist() for s in samples], [s.prompt_len for s in samples], index)
        tmp = folder / (shard_file(b) + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
        tmp.rename(folder / shard_file(b))
        written += 1
        tokens += sum(len(s.input_ids) - s.prompt_len for s in samples)
        logger.info("texts: batch %d done, %d answer tokens in %.0f s (%.0f tok/s)", b, tokens,
                    time.time() - start, tokens / max(time.time() - start, 1e-9))
    return written


def read_texts(folder: str | Path) -> list[dict]:
    """Every text of the folder's shards, in batch order (:func:`unpack`'s records)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / INDEX_FILE).exists():
        raise ValueError(f"{folder}: no {INDEX_FILE}: not a folder of texts (made by opttree.distill.data.texts)")
    records = []
    for path in sorted(folder.glob("texts_*.safetensors")):
        records.extend(unpack(load_file(str(path))))
    return records


def answer_order(tokenizer, prompts: list[Prompt], max_prompt_tokens: int, batch_size: int,
                 window: int = 8) -> list[Prompt]:
    """``prompts`` in answering order: each run of ``window`` batches sorted by length (shortest
    first, ties in the given order), so batches pad little and any prefix of batches keeps the
    given order's mix of kinds."""
    lengths = [len(chat_ids(tokenizer, p.text)[-max_prompt_tokens:]) for p in prompts]
    out, span = [], window * batch_size
    for s in range(0, len(prompts), span):
        part = range(s, min(len(prompts), s + span))
        out.extend(prompts[i] for i in sorted(part, key=lambda i: (lengths[i], i)))
    return out


def own_prompts(n: int, seed: int) -> list[Prompt]:
    """``n`` prompts written only from this library's templates and topics (no text of the machine's
    documents, which a repository may not ship): :func:`.chat_prompts.chat_prompts` without passages
    (their kinds become QA) and :func:`.prompts.seed_prompts` (which ask for German, for round 2),
    in turn."""
    from .chat_prompts import chat_prompts
    from .prompts import seed_prompts

    chat, seeded = chat_prompts((n + 1) // 2, seed), seed_prompts(n // 2, seed)
    return [p for pair in zip(chat, seeded) for p in pair] + chat[len(seeded):]


def prompts_over(folder: Path, tokenizer, n: int, seed: int) -> list[Prompt]:
    """``n`` round-2 prompts over the answers in ``folder`` (:func:`.prompts.context_prompts`:
    summaries, extraction, questions over a passage, its German answers back to English): text the
    target itself wrote, to prompts of this library's."""
    from .prompts import context_prompts

    stored = read_jsonl_prompts(folder / PROMPTS_FILE)
    responses = [(stored[r["prompt_index"]], tokenizer.decode(r["input_ids"][r["prompt_len"]:], skip_special_tokens=True))
                 for r in read_texts(folder)]
    return context_prompts(responses, n, seed)


def main(argv: list[str] | None = None) -> int:
    """``python -m opttree.distill.data.texts``: answer a folder's prompts with SmolLM2 cast to
    ``--dtype`` until ``--seconds`` have passed; a new folder's prompts are ``--count`` of
    :func:`own_prompts`, or with ``--over`` of :func:`prompts_over` that folder."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m opttree.distill.data.texts", description=main.__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="the folder of texts (made, or gone on from)")
    p.add_argument("--count", type=int, default=8192, help="a new folder's prompts")
    p.add_argument("--seed", type=int, default=341, help="a new folder's prompt seed")
    p.add_argument("--over", type=Path, default=None, help="a new folder's prompts are tasks over this folder's answers")
    p.add_argument("--seconds", type=float, default=None, help="stop starting batches after this long")
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from ...smollm2 import load_smollm2

    target, tokenizer = load_smollm2()
    identity = target_identity(target)  # of the model as loaded (float32), before the cast
    target = target.to(getattr(torch, args.dtype)).eval()
    settings = TextSettings(identity, args.dtype, args.max_new_tokens, 512, args.batch_size)
    prompts = None
    if not (args.out / INDEX_FILE).exists():
        made = (prompts_over(args.over, tokenizer, args.count, args.seed) if args.over is not None
                else own_prompts(args.count, args.seed))
        prompts = answer_order(tokenizer, made, 512, args.batch_size)
    deadline = None if args.seconds is None else time.time() + args.seconds
    written = answer_texts(target, tokenizer, args.out, settings, prompts, deadline, args.max_batches)
    done = len(list(args.out.glob("texts_*.safetensors")))
    print(f"{args.out}: {written} batches written, {done} in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
