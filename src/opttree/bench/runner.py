"""Run every method on every turn of every question, interleaved, and check greedy equality.

For each question, each turn is run by every method before the next turn starts (the order of
the methods rotates from one question to the next), so a machine that slows down or speeds up
during the run affects every method alike. Turn k+1 continues the conversation with the *plain*
method's answer to turn k, so that all methods see the same context. Every method's tokens are
compared with plain generate()'s: a speedup with a different answer is a failure, except where the
answer leaves plain's only at near-ties of the target's own scores, in any dtype (:mod:`opttree.tools.ties`:
the difference of rounding between a tree forward and a one-token one, its bound scaled to the dtype).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Callable, Sequence

import torch

from ..tools.ties import Outcome, PlainGreedy, Verdict, check_greedy, classify, plain_greedy
from ..tools.ties import first_divergence as first_difference
from .methods import Method, greedy_kwargs, make_methods
from .questions import Question, as_question, prompt_ids
from .records import REFERENCE, TurnRecord
from .report import BenchResult, environment

logger = logging.getLogger(__name__)


class PlainReruns:
    """Plain greedy generate() with its scores, from one prompt or a prefix of it, each run once (untimed):
    the methods of a turn that part from plain at the same ties share the reruns that judge them. One per
    turn: its runs hold [new tokens, vocab] scores each."""

    def __init__(self, target, generate_kwargs: dict):
        self.target, self.kwargs = target, generate_kwargs
        self.runs: dict[tuple, PlainGreedy] = {}
        self.made = 0  # reruns made (the rest were shared)

    def __call__(self, prefix: torch.Tensor, new_tokens: int) -> PlainGreedy:  # prefix: [1, T'] long
        key = (tuple(prefix[0].tolist()), new_tokens)
        if key not in self.runs:
            self.runs[key] = plain_greedy(self.target, prefix, max_new_tokens=new_tokens, **self.kwargs)
            self.made += 1
        return self.runs[key]


def judge_kwargs(target, input_ids: torch.Tensor, max_new_tokens: int) -> dict:
    """The generate() arguments plain's reruns take (greedy_kwargs less the mask and the length)."""
    kwargs = greedy_kwargs(target, input_ids, max_new_tokens)
    return {k: v for k, v in kwargs.items() if k not in ("attention_mask", "max_new_tokens")}


def judge(target, input_ids: torch.Tensor, tokens: list[int], plain_tokens: list[int],
          max_new_tokens: int, reruns: PlainReruns | None = None) -> Verdict:
    """A method's new tokens against plain's. Where they differ, plain generate() is rerun (untimed)
    with its scores kept, and the difference judged by :func:`opttree.tools.ties.check_greedy`, in
    float32 as in bfloat16 and float16 (the tie bound scales with the dtype's eps). reruns: the turn's
    :class:`PlainReruns`, shared by its methods (default: a new one).
    input_ids: [1, T] long, the turn's prompt."""
    if tokens == plain_tokens:
        return classify(plain_tokens, tokens, None, target.dtype)
    reruns = reruns or PlainReruns(target, judge_kwargs(target, input_ids, max_new_tokens))
    plain = reruns(input_ids, max_new_tokens)
    if plain.tokens != plain_tokens:
        logger.error("plain generate() gave other tokens when run again on the same prompt: no tie can be judged")
        return classify(plain_tokens, tokens, None, target.dtype)
    return check_greedy(target, input_ids, tokens, max_new_tokens=max_new_tokens, plain=plain, rerun=reruns,
                        **reruns.kwargs)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def graphs_compiled() -> int:
    """Graphs torch.compile has made in this process so far (dynamo's count; 0 before any compile)."""
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def cache_slots(lengths: Sequence[int], max_new_tokens: int, margin: int = 128, step: int = 256) -> int:
    """One static cache size for every prompt of a run: the longest prompt, its new tokens and a
    tree's margin, rounded up to ``step`` (so no prompt length recompiles a compiled method)."""
    need = max(lengths) + max_new_tokens + margin
    return -(-need // step) * step


def context_slots(tokenizer, questions: Sequence, max_new_tokens: int, max_turns: int | None = None) -> int:
    """:func:`cache_slots` for these questions: the context every method of the run must hold."""
    turns_of = [q.turns[:max_turns] if max_turns else q.turns for q in map(as_question, questions)]
    longest = [len(prompt_ids(tokenizer, turns, [""] * (len(turns) - 1))) + max_new_tokens * (len(turns) - 1)
               for turns in turns_of]
    return cache_slots(longest, max_new_tokens)


def run_method(method: Method, input_ids: torch.Tensor, max_new_tokens: int, tokenizer=None, *,
               question: Question, turn: int, question_index: int = 0, seed: int = 0) -> TurnRecord:
    """Time one generate() call and turn its output into a TurnRecord."""
    torch.manual_seed(seed)
    graphs_before = graphs_compiled()
    _sync(input_ids.device)
    start = time.perf_counter()
    out = method.generate(input_ids, max_new_tokens)
    _sync(input_ids.device)
    seconds = time.perf_counter() - start if out.seconds is None else out.seconds  # an engine's: its own clock
    new = out.sequences[0, input_ids.shape[1]:].tolist()
    record = TurnRecord(
        method=method.name, question_id=question.question_id, category=question.category, group=question.group,
        turn=turn, question_index=question_index, prompt_tokens=int(input_ids.shape[1]), new_tokens=len(new),
        wall_time=seconds, accept_lengths=list(out.accept_lengths), tokens=new,
        text=tokenizer.decode(new, skip_special_tokens=True) if tokenizer is not None else "",
        graphs_compiled=graphs_compiled() - graphs_before, drafts=out.drafts,
        accepted_per_pos=list(out.accepted_per_pos),
    )
    if out.stats is not None:
        record.expected_lengths = [s.expected_length for s in out.stats.steps]
        record.accepted = [s.accepted for s in out.stats.steps]
        record.tree_sizes = [s.tree_size for s in out.stats.steps]
        record.draft_seconds = sum(s.draft_seconds for s in out.stats.steps)
        record.verify_seconds = sum(s.verify_seconds for s in out.stats.steps)
    if sum(record.accept_lengths) != record.new_tokens:
        logger.warning("%s: accept lengths sum to %d but %d tokens were generated", method.name,
                       sum(record.accept_lengths), record.new_tokens)
    return record


def compare(record: TurnRecord, plain: TurnRecord, verdict: Verdict) -> None:
    """Write a method's comparison with plain into its record (and the log)."""
    record.first_mismatch = first_difference(record.tokens, plain.tokens)
    record.matches_plain = record.first_mismatch is None
    record.verdict = verdict.outcome.value
    record.ties = [asdict(t) for t in verdict.ties]
    where = f"{record.method} on question {record.question_id} turn {record.turn + 1}"
    if verdict.outcome is Outcome.MISMATCH:
        logger.error("GREEDY MISMATCH: %s differs from plain generate(): %s", where, verdict.describe())
    elif verdict.outcome is Outcome.TIE:
        logger.info("near-tie: %s leaves plain generate() only where its scores tie: %s", where, verdict.describe())


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="run", desc="bench")


def run_bench(target, draft, tokenizer, questions: Sequence, *,
              methods: Sequence = ("plain", "assisted", "lookup", "opttree"), max_new_tokens: int = 128,
              max_turns: int | None = None, warmup: int = 1, seed: int = 0,
              tree: dict | None = None, extra_trees: list[dict] | None = None, prompt_lookup_num_tokens: int = 10,
              num_assistant_tokens: int | None = None, assistant_schedule: str | None = None,
              progress: bool = True, header: dict | None = None, assistant=None,
              on_record: Callable[[TurnRecord], None] | None = None, drafts: dict | None = None) -> BenchResult:
    """Benchmark already-loaded models on Spec-Bench-style questions; returns a BenchResult.

    target, draft: causal LMs (draft may be None if no method needs one, and may be an EAGLE-style
    feature head; then ``assistant``, an HF draft model, serves ``assisted``); tokenizer: has
    ``encode``, ``decode`` and ``apply_chat_template`` (or no ``chat_template``: a plain transcript);
    questions: Question objects or Spec-Bench rows (``question_id``, ``category``, ``turns``);
    methods: names (see :func:`~opttree.bench.methods.make_methods`) or Method objects; ``plain``
    is added first if missing, as every other method is checked against it.
    warmup: runs of every method on the first question's first turn, not recorded; their seconds and
    the graphs they compiled go to the header (``warmup``), apart from the timed runs.
    on_record: called with each record as soon as its turn is judged (a run cut short keeps those).
    drafts: the drafts that extra trees name (``draft=NAME`` in one of ``extra_trees``), loaded, by name.
    """
    methods = list(methods)
    names = [m.name if isinstance(m, Method) else m for m in methods]
    if REFERENCE not in names:
        methods.insert(0, REFERENCE)
    questions = [as_question(q) for q in questions]
    if not questions:
        raise ValueError("no questions to run")
    turns_of = [q.turns[:max_turns] if max_turns else q.turns for q in questions]
    methods = make_methods(methods, target, draft, tree=tree, extra_trees=extra_trees,
                           prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                           num_assistant_tokens=num_assistant_tokens, assistant_schedule=assistant_schedule,
                           assistant=assistant, drafts=drafts,
                           max_cache_len=context_slots(tokenizer, questions, max_new_tokens, max_turns))
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"method names must be unique, got {[m.name for m in methods]}")
    device = target.device
    reference = next(m for m in methods if m.name == REFERENCE)

    def ids_for(turns, answers) -> torch.Tensor:  # -> [1, T] long
        return torch.tensor([prompt_ids(tokenizer, turns, answers)], dtype=torch.long, device=device)

    # warm-up: every method once or more on the first prompt (compiles happen here); not recorded
    warm_ids = ids_for(questions[0].turns[:1], [])
    warm = {m.name: {"seconds": 0.0, "graphs_compiled": 0} for m in methods}
    for _ in range(warmup):
        for method in methods:
            graphs, start = graphs_compiled(), time.perf_counter()
            method.generate(warm_ids, min(max_new_tokens, 32))
            _sync(device)
            warm[method.name]["seconds"] += time.perf_counter() - start
            warm[method.name]["graphs_compiled"] += graphs_compiled() - graphs

    bar = _progress(sum(len(t) for t in turns_of) * len(methods), progress)
    records: list[TurnRecord] = []
    for index, (question, turns) in enumerate(zip(questions, turns_of)):
        answers: list[str] = []
        for turn in range(len(turns)):
            input_ids = ids_for(turns[:turn + 1], answers)
            shift = index % len(methods)
            order = methods[shift:] + methods[:shift]
            by_name = {}
            for method in order:
                if bar is not None:
                    bar.set_postfix_str(f"q{question.question_id} t{turn + 1} {method.name}")
                by_name[method.name] = run_method(method, input_ids, max_new_tokens, tokenizer,
                                                  question=question, turn=turn, question_index=index, seed=seed)
                if bar is not None:
                    bar.update(1)
            plain = by_name[reference.name]
            reruns = PlainReruns(target, judge_kwargs(target, input_ids, max_new_tokens))  # this turn's
            for method in methods:
                record = by_name[method.name]
                if method is not reference:
                    compare(record, plain, judge(target, input_ids, record.tokens, plain.tokens, max_new_tokens,
                                                 reruns))
                records.append(record)
                if on_record is not None:
                    on_record(record)
            answers.append(plain.text if tokenizer is not None else "")
    if bar is not None:
        bar.close()
    info = dict(header or {})
    info.setdefault("environment", environment(target, draft, seed=seed))
    info["settings"] = {"max_new_tokens": max_new_tokens, "max_turns": max_turns, "warmup": warmup, "seed": seed,
                        "questions": len(questions), "greedy": True, "batch_size": 1}
    info["methods"] = {m.name: m.settings for m in methods}
    info["warmup"] = warm
    return BenchResult(records=records, methods=[m.name for m in methods], header=info)
