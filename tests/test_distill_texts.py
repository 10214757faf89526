"""A round's committed texts (opttree.distill.data.texts, issue 58 item 1): prompts and the target's
greedy answers as uint16 token ids in shards that a later run, here or on another machine, goes on
from. On a tiny random target: each text is the prompt's chat ids then the target's own greedy
answer; a run stopped after any batch and gone on from ends byte for byte as one uninterrupted run;
settings and prompts are never mixed (refused by name, before any generation); a target answering
in another dtype than the folder's is refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tokenizers")

from test_distill import tiny_target, tiny_tokenizer  # noqa: E402

from opttree.distill.data import texts as T  # noqa: E402
from opttree.distill.data.answers import chat_ids  # noqa: E402
from opttree.distill.data.prompts import Prompt  # noqa: E402

PROMPTS = [Prompt(f"question {i}: {'why ' * (i % 5)}is the sky blue?", "qa" if i % 2 else "writing") for i in range(10)]


@pytest.fixture(scope="module")
def pair():
    tok = tiny_tokenizer()
    return tiny_target(len(tok)), tok


def settings(model, **kw) -> T.TextSettings:
    return T.TextSettings(**{"target": T.target_identity(model), "dtype": "float32", "max_new_tokens": 6,
                             "max_prompt_tokens": 64, "batch_size": 4, **kw})


def test_texts_are_prompts_and_greedy_answers(tmp_path, pair):
    target, tok = pair
    assert T.answer_texts(target, tok, tmp_path, settings(target), PROMPTS) == 3  # 10 prompts in batches of 4
    records = T.read_texts(tmp_path)
    assert [r["prompt_index"] for r in records] == list(range(10))
    from safetensors.torch import load_file

    assert load_file(str(tmp_path / T.shard_file(0)))["ids"].dtype == torch.uint16
    for r in records[:3]:
        prompt = chat_ids(tok, PROMPTS[r["prompt_index"]].text)
        assert r["input_ids"][:r["prompt_len"]].tolist() == prompt
        with torch.no_grad():  # the target's own greedy answer, alone (no padding)
            out = target.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                                  eos_token_id=1)[0, len(prompt):]
        answer = r["input_ids"][r["prompt_len"]:]
        assert answer.tolist() == out[:len(answer)].tolist() and len(answer) >= 1


def test_a_stopped_run_goes_on_to_the_same_bytes(tmp_path, pair):
    target, tok = pair
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    T.answer_texts(target, tok, whole, settings(target), PROMPTS)
    assert T.answer_texts(target, tok, parts, settings(target), PROMPTS, max_batches=1) == 1
    assert T.answer_texts(target, tok, parts, settings(target), None, max_batches=1) == 1  # the folder's own prompts
    assert T.answer_texts(target, tok, parts, settings(target), None) == 1
    assert T.answer_texts(target, tok, parts, settings(target), None) == 0  # nothing left
    names = sorted(p.name for p in whole.iterdir())
    assert names == sorted(p.name for p in parts.iterdir())
    for name in names:
        assert (whole / name).read_bytes() == (parts / name).read_bytes(), name


def test_other_settings_prompts_or_dtype_are_refused(tmp_path, pair):
    target, tok = pair
    T.answer_texts(target, tok, tmp_path, settings(target), PROMPTS, max_batches=1)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="max_new_tokens: 6 there, 7 here"):
        T.answer_texts(target, tok, tmp_path, settings(target, max_new_tokens=7), None)
    with pytest.raises(ValueError, match="target: "):
        T.answer_texts(target, tok, tmp_path, settings(target, target="0" * 16), None)
    with pytest.raises(ValueError, match="other prompts"):
        T.answer_texts(target, tok, tmp_path, settings(target), PROMPTS[::-1])
    with pytest.raises(ValueError, match=r"answers in float32.*bfloat16 answers"):
        T.answer_texts(target, tok, tmp_path, settings(target, dtype="bfloat16"), None)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written by a refused run
    with pytest.raises(ValueError, match="not a folder of texts"):
        T.read_texts(tmp_path / "nothing")


def test_identity_knows_the_weights_not_the_object(pair):
    target, _ = pair
    other = tiny_target(target.config.vocab_size, seed=1)
    same = tiny_target(target.config.vocab_size, seed=0)
    assert T.target_identity(target) == T.target_identity(same) != T.target_identity(other)


def test_ids_past_uint16_are_refused():
    with pytest.raises(ValueError, match="uint16"):
        T.pack([[1, 70000]], [1], [0])
    back = T.unpack(T.pack([[5, 65535, 7], [9]], [2, 1], [3, 4]))
    assert [r["input_ids"].tolist() for r in back] == [[5, 65535, 7], [9]]
    assert [(r["prompt_len"], r["prompt_index"]) for r in back] == [(2, 3), (1, 4)]


def test_answer_order_sorts_within_windows(pair):
    _, tok = pair
    ordered = T.answer_order(tok, PROMPTS, 64, batch_size=2, window=2)  # windows of 4 prompts
    assert sorted(p.text for p in ordered[:4]) == sorted(p.text for p in PROMPTS[:4])
    lengths = [len(chat_ids(tok, p.text)) for p in ordered[:4]]
    assert lengths == sorted(lengths)


def test_own_prompts_read_no_document_of_the_machine(monkeypatch):
    """What a repository ships is written by the project: the committed round's prompts come from
    the library's templates and topics only (the machine's documents and catalogues are never read)."""
    from opttree.distill.data import sources

    def refuse(*_, **__):
        raise AssertionError("read the machine's documents")

    monkeypatch.setattr(sources, "local_documents", refuse)
    monkeypatch.setattr(sources, "german_strings", refuse)
    first = T.own_prompts(26, 3)
    assert [(p.text, p.kind) for p in first] == [(p.text, p.kind) for p in T.own_prompts(26, 3)]
    assert len(first) == 26 and {"writing", "coding", "math"} <= {p.kind for p in first}
    assert any(p.text.startswith("Translate into German") for p in T.own_prompts(200, 3))  # round 2 reads them back


def test_round_two_prompts_are_tasks_over_the_answers(tmp_path, pair):
    target, tok = pair
    T.answer_texts(target, tok, tmp_path, settings(target), PROMPTS)
    over = T.prompts_over(tmp_path, tok, 6, seed=0)
    answers = [tok.decode(r["input_ids"][r["prompt_len"]:], skip_special_tokens=True).strip()
               for r in T.read_texts(tmp_path)]
    assert len(over) == 6 and all(any(a and a in p.text for a in answers) for p in over)


def test_the_committed_round_reads_back():
    """drafts/smollm2-135m-eagle3's texts, as committed: every batch decodes, ids fit the vocabulary, the
    counts are the round's (RECIPE.md), and the head it made keeps to the issue's 20 MB."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-eagle3"
    first, second = T.read_texts(folder / "data"), T.read_texts(folder / "data-2")
    assert (len(first), len(second)) == (8192, 768)  # round one answered 6,240 of data/'s prompts, round two the rest
    answers = [sum(len(r["input_ids"]) - r["prompt_len"] for r in texts) for texts in (first, second)]
    assert answers == [713812 + 221995, 65215]
    assert max(int(r["input_ids"].max()) for r in first + second) < 49152
    assert len(T.read_jsonl_prompts(folder / "data" / T.PROMPTS_FILE)) == 8192
    assert [r["prompt_index"] for r in first] == list(range(8192))
    assert json.loads((folder / "round-1.json").read_text())["prompts_answered"] == 6240 + 768
    assert json.loads((folder / "round.json").read_text())["prompts_answered"] == 8192 + 768  # round two: all
    assert (folder / "model.safetensors").stat().st_size <= 20_000_000
