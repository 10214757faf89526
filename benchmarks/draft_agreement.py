"""Measure a distilled draft against its target on Spec-Bench prompts (or any JSONL of turns).

1. Top-1 agreement: the target answers each prompt greedily (first turn, chat template);
   the draft is then run teacher-forced on prompt + answer, and we count how often its argmax
   equals the target's greedy token at the answer positions. Reported per category and overall.
   For an EAGLE-style feature head (``opttree distill --kind head``), the head reads the
   target's features of the same text; agreement is reported at tree depth 1 (the first drafted
   token, comparable to an independent draft's number) and, teacher-forced on the tokens but
   reading its own predicted features, at depths 2 and 3; and at each depth given the path so far
   was accepted (the roots whose shallower drafted tokens all agreed), with the τ of a chain of
   that many drafted tokens (:mod:`opttree.distill.train.depths`).
2. Latency: one forward of ``--query-tokens`` new tokens on a ``--prefix`` token cached prefix
   (batch 1, as in decoding), median of ``--reps`` runs, draft vs target → their ratio. A feature
   head is timed as the drafter runs it: one tree layer of that many nodes, probabilities included;
   ``--layer-dtypes`` times it in each dtype listed, ``--target-dtypes`` the target likewise.
3. The kept vocabulary's caps (``--kept-sizes``): each feature head is also measured widened to
   each size (its own tokens first, then the most frequent greedy tokens of ``--rank-records``'
   shards, or, without them, the lowest ids: a BPE vocabulary's earliest merges), the new output
   rows the target's own with a bias at the 5th percentile of the head's
   (:func:`opttree.distill.train.head.widened`). Every head's report gives the share of the answer
   tokens its kept set covers and its depth-1 agreement over the covered positions alone
   (``agreement_covered``); tokens outside the set count as misses everywhere else.

Usage::

    python benchmarks/draft_agreement.py --questions /path/spec_bench_questions.jsonl \
        --draft drafts/smollm2-135m-draft --per-category 5 --max-new-tokens 64

The target's answers are cached in ``--answers-cache`` (JSON) so that several drafts can be
compared on the same continuations without regenerating them.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from opttree.drafters.head.feature_head import FeatureHead
from opttree.loading.eagle import Eagle3Head
from opttree.hf.compat import with_cache

logger = logging.getLogger("draft_agreement")


def select_questions(path: Path, per_category: int) -> list[dict]:
    """The first ``per_category`` questions of each category (file order), first turn only."""
    chosen, counts = [], defaultdict(int)
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        if per_category <= 0 or counts[q["category"]] < per_category:
            counts[q["category"]] += 1
            chosen.append({"id": q.get("question_id"), "category": q["category"], "prompt": q["turns"][0]})
    return chosen


def target_answers(target, tokenizer, questions: list[dict], max_new_tokens: int,
                   batch_size: int, max_prompt_tokens: int) -> list[dict]:
    """Greedy answers of the target: ``{"category", "prompt_ids", "answer_ids"}`` per question."""
    from opttree.distill.data.answers import DataConfig, answer_batch, chat_ids

    cfg = DataConfig(max_new_tokens=max_new_tokens, batch_size=batch_size, topk=1,
                     max_prompt_tokens=max_prompt_tokens)
    ids = [chat_ids(tokenizer, q["prompt"])[-max_prompt_tokens:] for q in questions]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: dict[int, dict] = {}
    for s in range(0, len(order), batch_size):
        batch = order[s:s + batch_size]
        for i, sample in zip(batch, answer_batch(target, tokenizer, [ids[i] for i in batch], cfg)):
            out[i] = {"category": questions[i]["category"], "id": questions[i]["id"],
                      "prompt_ids": ids[i], "answer_ids": sample.input_ids[sample.prompt_len:].tolist()}
        logger.info("target answers: %d/%d", len(out), len(ids))
    return [out[i] for i in range(len(ids))]


@torch.inference_mode()
def agreement_by_category(draft, answers: list[dict]) -> dict[str, tuple[int, int]]:
    """``{category: (hits, tokens)}``: draft argmax == target greedy token, teacher-forced."""
    result: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for a in answers:
        seq = torch.tensor([a["prompt_ids"] + a["answer_ids"]])  # [1, L]
        n, start = len(a["answer_ids"]), len(a["prompt_ids"]) - 1
        logits = draft(input_ids=seq, logits_to_keep=n + 1).logits[0, :n]  # [n, V]
        guess = logits.argmax(-1)  # [n]
        hits = int((guess == torch.tensor(a["answer_ids"])).sum())
        result[a["category"]][0] += hits
        result[a["category"]][1] += n
        del start
    return {k: (v[0], v[1]) for k, v in result.items()}


@torch.inference_mode()
def head_agreement_by_category(head, target, answers: list[dict], depths: int = 3) -> dict[str, list[tuple[int, int]]]:
    """``{category: [(hits, tokens) at depth 1, 2, ...]}`` for a feature head."""
    return heads_agreement_by_category([head], target, answers, depths)[0]


@torch.inference_mode()
def heads_agreement_by_category(heads: list, target, answers: list[dict], depths: int = 3,
                                paths: list | None = None) -> list[dict]:
    """:func:`head_agreement_by_category` of several heads, with ONE target forward per prompt
    (the union of the target layers the heads read is kept, each head picks its own).
    ``paths``: a list that receives, per head, ``{category: DepthCounts}`` (agreement at each
    depth given the path so far was accepted, and a chain's τ: :mod:`opttree.distill.train.depths`)."""
    from opttree.distill.train.depths import DepthCounts, depth_counts
    from opttree.distill.data.features import features_of
    from opttree.distill.train.head_data import make_batch, pick_layers
    from opttree.distill.train.head_loss import unrolled

    layers = tuple(sorted({i for h in heads for i in h.c.feature_layers if i != -1})) + (-1,)
    results = [defaultdict(lambda: [[0, 0] for _ in range(depths)]) for _ in heads]
    by_path = [defaultdict(lambda: DepthCounts(depths)) for _ in heads]
    for a in answers:
        seq = torch.tensor(a["prompt_ids"] + a["answer_ids"])  # [L]
        record = features_of(target, seq, topk=1, layers=layers)  # hidden [L, len(layers) * H]
        first = len(a["prompt_ids"]) - 1  # position whose output predicts the first answer token
        scored = torch.zeros(len(seq), dtype=torch.bool)  # [L]: roots in the answer
        scored[first:-1] = True
        for head, result, path in zip(heads, results, by_path):
            own = dict(record, hidden=pick_layers(record["hidden"], layers, head.c.feature_layers))
            passes = unrolled(head, make_batch([own], head.device), depths, 0.0)  # depths x [1, L, H]
            hits = []  # depths x [L] bool: pass d at j agrees with token j + 1
            for d, g in enumerate(passes):
                guess = head.token_ids[head.reduced_logits(g[0, :-1]).argmax(-1)].cpu()  # [L - 1]
                hits.append(torch.cat([guess == seq[1:], torch.zeros(1, dtype=torch.bool)]))
                start = max(first, d)  # every node in the answer, its root possibly in the prompt
                result[a["category"]][d][0] += int(hits[d][start:-1].sum())
                result[a["category"]][d][1] += len(seq) - 1 - start
            path[a["category"]] = path[a["category"]].add(depth_counts(hits, scored))
    if paths is not None:
        paths.extend(dict(p) for p in by_path)
    return [{k: [tuple(x) for x in v] for k, v in r.items()} for r in results]


@torch.inference_mode()
def eagle3_agreement_by_category(head, target, answers: list[dict], depths: int = 3) -> dict[str, list[tuple[int, int]]]:
    """``{category: [(hits, tokens) at depth 1, 2, ...]}`` for an EAGLE-3 head, counted as for a feature
    head: pass d at entry e (the taps of position e, token e + 1) guesses token e + 2, scored where that
    token is an answer token and e >= d; a token outside the draft vocabulary is a miss."""
    from opttree.distill.data.features import features_of
    from opttree.distill.eagle3.unroll import paired, unrolled
    from opttree.distill.train.head_data import make_batch

    result = defaultdict(lambda: [[0, 0] for _ in range(depths)])
    for a in answers:
        seq = torch.tensor(a["prompt_ids"] + a["answer_ids"])  # [L]
        record = features_of(target, seq, topk=1, layers=tuple(head.c.taps))  # hidden [L, 3H]
        passes = unrolled(head, paired(make_batch([record], head.device)), depths)  # depths x [1, L - 1, h]
        e = torch.arange(len(seq) - 2)  # entries whose guessed token e + 2 exists
        answer = e + 2 >= len(a["prompt_ids"])
        for d, g in enumerate(passes):
            guess = head.token_ids[head.reduced_logits(g[0, :len(e)]).argmax(-1)].cpu()  # [L - 2]
            where = answer & (e >= d)
            result[a["category"]][d][0] += int((guess == seq[2:])[where].sum())
            result[a["category"]][d][1] += int(where.sum())
    return {k: [tuple(x) for x in v] for k, v in result.items()}


def path_report(counts: dict) -> dict:
    """The report's entries from ``{category: DepthCounts}``: agreement at each depth given the
    path so far was accepted (all categories, and per category), and a chain's τ."""
    from opttree.distill.train.depths import DepthCounts

    total = DepthCounts(next(iter(counts.values())).depths)
    for c in counts.values():
        total = total.add(c)
    return {"agreement_by_depth_given_accepted": [round(x, 4) for x in total.path_agreement()],
            "chain_tau": round(total.chain_tau(), 3),
            "per_category_given_accepted": {k: [round(x, 4) for x in c.path_agreement()]
                                            for k, c in sorted(counts.items())}}


def head_report(name: str, by_depth: dict, answers: list[dict], max_new_tokens: int) -> dict:
    """The JSON report of one head from its per-category, per-depth counts."""
    per_cat = {k: v[0] for k, v in by_depth.items()}
    hits, total = sum(h for h, _ in per_cat.values()), sum(n for _, n in per_cat.values())
    depths = len(next(iter(by_depth.values())))
    return {
        "draft": name, "prompts": len(answers), "answer_tokens": total, "max_new_tokens": max_new_tokens,
        "agreement_token_weighted": hits / total,
        "agreement_category_mean": statistics.mean(h / n for h, n in per_cat.values()),
        "per_category": {k: round(h / n, 4) for k, (h, n) in sorted(per_cat.items())},
        "agreement_by_depth": [
            round(sum(v[d][0] for v in by_depth.values()) / max(1, sum(v[d][1] for v in by_depth.values())), 4)
            for d in range(depths)],
        "latency_ms": {},
    }


@torch.inference_mode()
def head_layer_ms(head, target, prefix_len: int, query: int, reps: int) -> float:
    """Median ms of one tree layer of ``query`` nodes drafted by a feature head on a prefix."""
    from opttree.tree import DraftTree

    gen = torch.Generator().manual_seed(0)
    vocab = head.c.vocab_size
    prefix = torch.randint(0, vocab, (prefix_len,), generator=gen)
    pool = DraftTree(torch.randint(0, vocab, (query,), generator=gen), torch.full((query,), -1), torch.ones(query))
    times = []
    for _ in range(reps + 3):
        drafter = head.for_target(target)
        features = torch.randn(1, prefix_len - 1, head.c.feature_width, generator=gen)  # the target's layers
        drafter.add_features(head.fuse(features)[0])  # what the loop hands a fused head: [T, H]
        drafter.root_probs(prefix)
        t = time.perf_counter()
        drafter.expand_probs(pool, torch.arange(query))  # what decoding calls
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times[3:])


@torch.inference_mode()
def forward_ms(model, prefix_len: int, query: int, reps: int, vocab: int) -> float:
    """Median ms of one ``query``-token forward on a cached ``prefix_len``-token prefix."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, prefix_len), generator=gen)
    tokens = torch.randint(0, vocab, (1, query), generator=gen)
    times = []
    for _ in range(reps + 3):
        cache = DynamicCache()
        model(input_ids=prefix, **with_cache(model, cache), use_cache=True)
        pos = torch.arange(prefix_len, prefix_len + query)
        t = time.perf_counter()
        model(input_ids=tokens, position_ids=pos[None], cache_position=pos, **with_cache(model, cache),
              use_cache=True)
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times[3:])


def answer_tokens(answers: list[dict]) -> torch.Tensor:
    """[N] long: every answer token, the tokens depth-1 agreement is counted on."""
    return torch.tensor([t for a in answers for t in a["answer_ids"]], dtype=torch.long)


def kept_ranking(record_dirs: list[Path], vocab_size: int) -> torch.Tensor:
    """[V] ids, most useful first: by the target's greedy-token counts in the shards under
    ``record_dirs`` (``opttree.distill.train.shared.ranked_tokens``), or in id order without any."""
    from opttree.distill.train.coverage import id_ranking
    from opttree.distill.data.shards import load_records, shard_paths
    from opttree.distill.train.shared import ranked_tokens

    records = [{"topk_ids": r["topk_ids"]} for d in record_dirs for p in shard_paths(d) for r in load_records(p)]
    return ranked_tokens(records, vocab_size, []) if records else id_ranking(vocab_size)


def widened_heads(head, target, sizes: list[int], ranked: torch.Tensor) -> list[tuple[int, object]]:
    """``(size, head widened to size)`` for each size above the head's own kept count, float32."""
    from opttree.distill.train.coverage import extended_kept
    from opttree.distill.train.head import widened

    own = len(head.token_ids)
    return [(size, widened(head, target, extended_kept(head.token_ids, ranked, size)).eval())
            for size in sizes if size > own]


def coverage_report(head, answers: list[dict], agreement_depth1: float) -> dict:
    """The kept set's size, the share of answer tokens it covers, and depth-1 agreement over the
    covered positions (every depth-1 hit is a covered position, so it is agreement / coverage)."""
    from opttree.distill.train.coverage import set_coverage

    covered = set_coverage(head.token_ids, answer_tokens(answers))
    return {"kept_tokens": len(head.token_ids), "coverage": round(covered, 4),
            "agreement_covered": round(agreement_depth1 / covered, 4) if covered else 0.0}


def chain_speed(tau: float, depth: int, verify_ms: float, layer_ms: float, plain_ms: float) -> float:
    """Tokens per unit of plain decoding's time for a chain of ``depth`` drafted tokens: ``tau``
    tokens per step that costs one verify forward of depth + 1 tokens (``verify_ms``) and ``depth``
    tree layers (``layer_ms`` each), against plain's one-token forward (``plain_ms``)."""
    return tau * plain_ms / (verify_ms + depth * layer_ms)


def in_dtype_copy(model, dtype_name: str):
    """``model`` in the dtype named (a copy where it differs; a feature head keeps the target's embedding)."""
    from opttree.loading.dtype_probe import cast_copy, model_dtype

    dtype = getattr(torch, dtype_name)
    return model if model_dtype(model) == dtype else cast_copy(model, dtype).eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", required=True, type=Path, help="Spec-Bench question.jsonl")
    p.add_argument("--draft", nargs="+", default=[str(Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-draft")],
                   help="one or more drafts; feature heads share one target forward per prompt")
    p.add_argument("--target", default=None, help="folder holding the SmolLM2 GGUF (default: fetched)")
    p.add_argument("--per-category", type=int, default=5, help="questions per category (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--answers-cache", type=Path, default=None)
    p.add_argument("--prefix", type=int, default=256)
    p.add_argument("--query-tokens", type=int, nargs="+", default=[1, 8])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="dtype of the draft (default: a feature head in float32, a model in the target's)")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--kept-sizes", type=int, nargs="*", default=[],
                   help="also measure each feature head widened to these kept-set sizes (e.g. 24576 32768 49152)")
    p.add_argument("--rank-records", type=Path, nargs="*", default=[],
                   help="shard folders (the target's answers or features) whose greedy tokens rank the added tokens")
    p.add_argument("--layer-dtypes", nargs="*", default=[], choices=["float32", "bfloat16"],
                   help="time each feature head's tree layer in each of these dtypes too")
    p.add_argument("--target-dtypes", nargs="*", default=[], choices=["float32", "bfloat16"],
                   help="time the target's forward in each of these dtypes too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)

    from opttree import load_draft
    from opttree.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(args.target)
    dtype = getattr(torch, args.draft_dtype) if args.draft_dtype else None
    drafts = [load_draft(path, target, dtype=dtype) for path in args.draft]
    questions = select_questions(args.questions, args.per_category)
    cache_ok = args.answers_cache and args.answers_cache.exists()
    if cache_ok:
        answers = json.loads(args.answers_cache.read_text())
        cache_ok = len(answers) == len(questions) and all(
            a["id"] == q["id"] for a, q in zip(answers, questions))
    if not cache_ok:
        t = time.time()
        answers = target_answers(target, tokenizer, questions, args.max_new_tokens,
                                 args.batch_size, args.max_prompt_tokens)
        logger.info("target answered %d prompts in %.0f s", len(answers), time.time() - t)
        if args.answers_cache:
            args.answers_cache.write_text(json.dumps(answers))
    names = [str(path) for path in args.draft]
    if args.kept_sizes:
        ranked = kept_ranking(args.rank_records, target.config.vocab_size)
        for path in list(args.draft):
            plain = load_draft(path, target)  # float32: widened, then cast like the others
            if isinstance(plain, FeatureHead):
                for size, wide in widened_heads(plain, target, args.kept_sizes, ranked):
                    names.append(f"{path}@{size}")
                    drafts.append(wide if dtype is None else in_dtype_copy(wide, args.draft_dtype))
    heads = [(path, d) for path, d in zip(names, drafts) if isinstance(d, FeatureHead)]
    path_counts: list[dict] = []
    head_counts = heads_agreement_by_category([d for _, d in heads], target, answers, paths=path_counts) if heads else []
    reports = []
    for path, draft in zip(names, drafts):
        if isinstance(draft, FeatureHead):
            index = [p for p, _ in heads].index(path)
            report = head_report(str(path), head_counts[index], answers, args.max_new_tokens)
            report.update(path_report(path_counts[index]))
            report.update(coverage_report(draft, answers, report["agreement_by_depth"][0]))
        elif isinstance(draft, Eagle3Head):
            report = head_report(str(path), eagle3_agreement_by_category(draft, target, answers), answers,
                                 args.max_new_tokens)
            report.update(coverage_report(draft, answers, report["agreement_by_depth"][0]))
        else:
            per_cat = agreement_by_category(draft, answers)
            report = head_report(str(path), {k: [v] for k, v in per_cat.items()}, answers, args.max_new_tokens)
            del report["agreement_by_depth"]
        reports.append(report)
        print(f"== {path}")
        if "agreement_by_depth" in report:
            print("head agreement by tree depth (teacher-forced tokens, own features):",
                  " ".join(f"{a:.3f}" for a in report["agreement_by_depth"]))
            if "chain_tau" in report:
                print("  given the path so far was accepted:",
                      " ".join(f"{a:.3f}" for a in report["agreement_by_depth_given_accepted"]),
                      f"(a chain of {len(report['agreement_by_depth'])}: tau {report['chain_tau']:.2f})")
            print(f"  {report['kept_tokens']} kept tokens cover {report['coverage']:.3f} of the answer tokens; "
                  f"depth-1 agreement where covered: {report['agreement_covered']:.3f}")
        print(f"top-1 agreement over {report['answer_tokens']} answer tokens of {len(answers)} prompts: "
              f"{report['agreement_token_weighted']:.3f} (category mean {report['agreement_category_mean']:.3f})")
        for k, v in report["per_category"].items():
            print(f"  {k:15s} {v:.3f}")
    vocab = target.config.vocab_size
    for q in args.query_tokens:
        t_ms = forward_ms(target, args.prefix, q, args.reps, vocab)
        others = {name: round(forward_ms(in_dtype_copy(target, name), args.prefix, q, args.reps, vocab), 2)
                  for name in args.target_dtypes}  # the target in other dtypes, beside the heads' figures
        if others:
            print(f"target forward of {q} token(s) by dtype (ms): {others}")
        for report, draft in zip(reports, drafts):
            if isinstance(draft, Eagle3Head):  # its tree layer is timed end to end (opttree bench), not here
                continue
            d_ms = (head_layer_ms(draft, target, args.prefix, q, args.reps) if isinstance(draft, FeatureHead)
                    else forward_ms(draft, args.prefix, q, args.reps, vocab))
            report["latency_ms"][str(q)] = {"target": round(t_ms, 2), "draft": round(d_ms, 2),
                                            "ratio": round(d_ms / t_ms, 4), "target_by_dtype": others}
            print(f"{report['draft']}: forward of {q} token(s) on a {args.prefix}-token prefix: "
                  f"target {t_ms:.1f} ms, draft {d_ms:.1f} ms, ratio {d_ms / t_ms:.3f}")
            if isinstance(draft, FeatureHead):
                for name in args.layer_dtypes:
                    ms = head_layer_ms(in_dtype_copy(draft, name), target, args.prefix, q, args.reps)
                    report["latency_ms"][str(q)][name] = round(ms, 2)
                    print(f"  tree layer in {name}: {ms:.1f} ms ({ms / t_ms:.3f} of the target's float32 forward)")
    depth = 3
    if 1 in args.query_tokens and depth + 1 in args.query_tokens:
        for report in reports:
            if "chain_tau" in report:
                ms = report["latency_ms"]
                report["chain_speed"] = round(chain_speed(report["chain_tau"], depth, ms[str(depth + 1)]["target"],
                                                          ms["1"]["draft"], ms["1"]["target"]), 3)
    if args.json_out:
        args.json_out.write_text(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
