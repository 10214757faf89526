"""The ``chat`` prompt source of a distillation round (issue 26, round 2): the 13 kinds of task of
Spec-Bench, from seed topics and the machine's own texts, never Spec-Bench's text."""

import json
from collections import Counter
from pathlib import Path

from opttree.distill.data.chat_prompts import KINDS, TEMPLATES, chat_prompts
from opttree.distill.data.sources import prompts_of

DOCS = (("notes", "First sentence of a document. " * 80),)
GERMAN = ("Die Datei konnte nicht gelesen werden, bitte erneut versuchen.",)
SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_questions.jsonl"


def test_every_kind_comes_in_turn_and_the_seed_decides_the_text():
    prompts = chat_prompts(13 * 4, seed=3, docs=DOCS, german=GERMAN)
    assert [p.kind for p in prompts] == list(KINDS) * 4
    assert prompts == chat_prompts(13 * 4, seed=3, docs=DOCS, german=GERMAN)
    assert prompts != chat_prompts(13 * 4, seed=4, docs=DOCS, german=GERMAN)
    assert not [p.text for p in prompts if "{" in p.text or "}" in p.text]  # every slot filled


def test_kinds_that_need_a_text_become_questions_where_the_machine_has_none():
    prompts = chat_prompts(26, seed=0)
    assert len(prompts) == 26
    kinds = Counter(p.kind for p in prompts)
    assert not {"summarization", "extraction", "rag", "translation"} & set(kinds)
    assert kinds["qa"] == 2 * 5  # its own turns and the four kinds' turns
    with_texts = chat_prompts(26, seed=0, docs=DOCS, german=GERMAN)
    assert any("First sentence of a document." in p.text for p in with_texts if p.kind == "summarization")
    assert any(GERMAN[0] in p.text for p in with_texts if p.kind == "translation")


def test_a_recipe_source_names_it():
    prompts = prompts_of("chat", 13, seed=5)
    assert len(prompts) == 13 and {p.kind for p in prompts} <= set(KINDS)


def test_no_template_is_a_spec_bench_question():
    if not SPEC_BENCH.exists():  # the benchmark's questions are beside the repo on our machines
        questions = []
    else:
        questions = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    turns = {" ".join(t.split()).lower() for q in questions for t in q.get("turns", [])}
    for template in (t for kind in TEMPLATES.values() for t in kind):
        fixed = max(template.split("{"), key=len).split("}")[-1].strip().lower()  # its longest literal part
        assert not any(fixed and fixed in turn for turn in turns if len(fixed) > 40), template
