"""Spec-Bench questions (Xia et al. 2024, "Unlocking Efficiency in Large Language Model
Inference: A Comprehensive Survey of Speculative Decoding", github.com/hemingkx/Spec-Bench,
``data/spec_bench/question.jsonl``): loading, choosing, and turning turns into chat prompts.

Spec-Bench has six tasks: ``mt_bench`` (multi-turn conversation: MT-Bench's eight categories,
two turns each), ``translation``, ``summarization``, ``qa``, ``math_reasoning`` and ``rag``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

SPEC_BENCH_URL = "https://github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl, Apache-2.0)"
# 13 questions (one per Spec-Bench category, MT-Bench's with two turns) written for this project, so that
# `opttree bench --quick` runs without the Spec-Bench file; the numbers that count come from Spec-Bench's.
QUICK_QUESTIONS = Path(__file__).resolve().parent / "data" / "quick_questions.jsonl"

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
CATEGORIES = MT_BENCH_CATEGORIES + TASKS[1:]  # the 13 file categories


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str  # the file's own category, e.g. "writing" or "translation"
    turns: tuple[str, ...]  # user messages; turn k+1 follows the reference answer to turn k
    group: str = ""  # the row of the report it counts in (a task or a category)

    @property
    def task(self) -> str:
        return "mt_bench" if self.category in MT_BENCH_CATEGORIES else self.category


def as_question(row) -> Question:
    """A Question from a Spec-Bench JSON row (a dict) or a Question."""
    if isinstance(row, Question):
        return row if row.group else replace(row, group=row.task)
    if not isinstance(row, dict) or "question_id" not in row or not isinstance(row.get("turns"), list):
        raise ValueError("not a Spec-Bench question: each line must be a JSON object with 'question_id', "
                         "'category' and 'turns' (a list of user messages)")
    question = Question(question_id=row["question_id"], category=row.get("category", "unknown"),
                        turns=tuple(row["turns"]))
    return replace(question, group=question.task)


def load_questions(path: str | Path) -> list[Question]:
    """Read a Spec-Bench ``question.jsonl`` (one JSON object a line: question_id, category, turns)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such question file. Get Spec-Bench's from {SPEC_BENCH_URL}")
    questions = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                questions.append(as_question(json.loads(line)))
            except ValueError as error:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{path}, line {number}: {error}. Spec-Bench's file: {SPEC_BENCH_URL}") from None
    if not questions:
        raise ValueError(f"{path}: no questions in it. Spec-Bench's file: {SPEC_BENCH_URL}")
    return questions


def _round_robin(questions: list[Question]) -> list[Question]:
    """Interleave sub-categories (writing, roleplay, ...) so that the first N cover them all."""
    by_category: dict[str, list[Question]] = {}
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    lists = list(by_category.values())
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst)]


def select_questions(questions: Sequence, categories: Sequence[str] | None = None,
                     per_category: int | None = None) -> list[Question]:
    """Keep the questions of ``categories`` (task names such as ``mt_bench`` or file categories
    such as ``writing``; None = the six tasks), the first ``per_category`` of each, in file order
    (MT-Bench's sub-categories taken in turn). Each question's ``group`` is the name that chose it."""
    pool = [as_question(q) for q in questions]
    names = list(categories) if categories else [t for t in TASKS if any(q.task == t for q in pool)]
    chosen: list[Question] = []
    for name in names:
        matching = [replace(q, group=name) for q in pool if name in (q.task, q.category)]
        if not matching:
            known = sorted({q.task for q in pool} | {q.category for q in pool})
            raise ValueError(f"no question of category {name!r}; known: {', '.join(known)}")
        if name == "mt_bench":
            matching = _round_robin(matching)
        chosen.extend(matching[:per_category] if per_category else matching)
    return chosen


def messages_for(turns: Sequence[str], answers: Sequence[str]) -> list[dict]:
    """Chat messages for the next turn: user/assistant alternating, ending with a user turn."""
    if len(answers) != len(turns) - 1:
        raise ValueError("need one answer for every turn but the last")
    messages = []
    for k, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if k < len(answers):
            messages.append({"role": "assistant", "content": answers[k]})
    return messages


def prompt_ids(tokenizer, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Token ids of the conversation so far with the tokenizer's chat template (a plain
    ``User:``/``Assistant:`` transcript when it has none), ready for the next answer."""
    messages = messages_for(turns, answers)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
    return list(tokenizer.encode(text, add_special_tokens=False))
