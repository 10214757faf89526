"""The real target, SmolLM2-135M-Instruct: greedy output is unchanged on the project's own prompts
(tests/data/prompts.jsonl, one per Spec-Bench category, written for this project, so these tests run on any
clone) and, where the file is present, on Spec-Bench's (``$OPTTREE_SPEC_BENCH`` or ../shared/data)."""

import json
import os
import weakref
from pathlib import Path

import pytest
import torch

from opttree import SpeculativeGenerator
from threads import real_model_threads

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

QUESTIONS = Path(os.environ.get(
    "OPTTREE_SPEC_BENCH", Path(__file__).resolve().parents[1].parent / "shared/data/spec_bench_questions.jsonl"))
OWN_PROMPTS = Path(__file__).resolve().parent / "data" / "prompts.jsonl"
SHIPPED_DRAFT = Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-draft"
SHIPPED_HEAD = Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-head"
SHIPPED_EAGLE3 = Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-eagle3"


def own_prompts() -> list[str]:
    """13 first turns, one per category; shipped with the tests."""
    return first_turns(OWN_PROMPTS)


def spec_bench_prompts(count_per_category: int = 1) -> list[str]:
    if not QUESTIONS.is_file():
        pytest.skip(f"Spec-Bench questions not found at {QUESTIONS} (set OPTTREE_SPEC_BENCH); "
                    "the other real-model tests use tests/data/prompts.jsonl")
    return first_turns(QUESTIONS, count_per_category)


def first_turns(path: Path, count_per_category: int = 1) -> list[str]:
    seen: dict[str, int] = {}
    prompts = []
    for line in path.read_text().splitlines():
        q = json.loads(line)
        if seen.get(q["category"], 0) < count_per_category:
            seen[q["category"]] = seen.get(q["category"], 0) + 1
            prompts.append(q["turns"][0])
    return prompts


@pytest.fixture(scope="module")
def smollm2():
    from opttree.smollm2 import load_smollm2

    threads = torch.get_num_threads()
    torch.set_num_threads(real_model_threads())
    yield load_smollm2()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def real_draft(smollm2):
    target, _ = smollm2
    if (SHIPPED_DRAFT / "opttree_draft.json").is_file():
        from opttree import load_draft

        return load_draft(SHIPPED_DRAFT, target)
    from opttree.drafters.truncated import truncated_draft

    return truncated_draft(target, 2)


def test_greedy_equality_on_the_projects_prompts(smollm2, real_draft):
    check_prompts(smollm2, SpeculativeGenerator(smollm2[0], real_draft, nodes=16, threshold=0.3, max_depth=6))


def test_greedy_equality_on_spec_bench(smollm2, real_draft):
    check_prompts(smollm2, SpeculativeGenerator(smollm2[0], real_draft, nodes=16, threshold=0.3, max_depth=6),
                  spec_bench_prompts())


def test_greedy_equality_with_the_default_tree_and_a_draft_folder(smollm2):
    """No tree arguments (nodes/threshold "auto") and the shipped head given as a folder."""
    target, _ = smollm2
    check_prompts(smollm2, SpeculativeGenerator(target, str(SHIPPED_HEAD)), own_prompts()[:4])


def test_greedy_equality_with_the_shipped_feature_head_and_lookup(smollm2):
    from opttree import load_draft
    from opttree.drafters import MixedDrafter

    target, _ = smollm2
    head = load_draft(SHIPPED_HEAD, target)
    accepted = check_prompts(smollm2, SpeculativeGenerator(target, MixedDrafter(head), nodes=8, threshold=0.3))
    assert sum(accepted) / len(accepted) > 1.3  # the trained head (and lookup) really is accepted


def test_greedy_equality_with_the_shipped_eagle3_head(smollm2):
    """The EAGLE-3 head made on a CPU (issue 58): the published layout as it ships, accepted and lossless."""
    from opttree import load_draft
    from opttree.drafters.head.eagle import EagleHead

    target, _ = smollm2
    head = load_draft(SHIPPED_EAGLE3, target)
    assert isinstance(head, EagleHead) and head.c.draft_vocab_size == 8192 and head.c.taps == (2, 15, 27)
    accepted = check_prompts(smollm2, SpeculativeGenerator(target, head, nodes=8, threshold=0.3), own_prompts()[:6])
    assert sum(accepted) / len(accepted) > 1.3  # the trained head really is accepted


PLAIN = weakref.WeakKeyDictionary()  # target -> {prompt: its own greedy output}: each computed once a run


def plain_greedy_24(target, text: str, ids: dict) -> torch.Tensor:
    """The target's own greedy generate() of 24 new tokens for this prompt, computed once per target (the
    tests below compare several drafts with the same outputs; plain decoding is deterministic)."""
    known = PLAIN.setdefault(target, {})
    if text not in known:
        known[text] = target.generate(**ids, max_new_tokens=24, do_sample=False)
    return known[text]


def check_prompts(smollm2, gen, prompts: list[str] | None = None) -> list[int]:
    """Greedy equality on one first turn per category (24 new tokens); returns accept lengths."""
    target, tok = smollm2
    prompts = own_prompts() if prompts is None else prompts
    assert len(prompts) >= 4
    accepted = []
    for text in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        ids = {k: v[:, -384:] for k, v in ids.items()}  # keep the check fast on long RAG prompts
        ref = plain_greedy_24(target, text, ids)
        out = gen.generate(**ids, max_new_tokens=24, do_sample=False)
        assert torch.equal(out, ref), tok.decode(ref[0, ids["input_ids"].shape[1]:])
        accepted += gen.last_stats.accept_lengths
    assert sum(accepted) <= 24 * len(prompts) and all(a >= 1 for a in accepted)
    return accepted


def test_batched_greedy_equality(smollm2, real_draft):
    """Three prompts of different lengths, left-padded, in one batch: row by row what the target's
    own batched greedy generate() returns."""
    from opttree import speculative_generate

    target, tok = smollm2
    rows = []
    for text in own_prompts()[:3]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"][0, -64:]
        rows.append(ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, width - len(r):], mask[b, width - len(r):] = r, 1
    assert len({len(r) for r in rows}) > 1  # really padded
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=pad)
    ref = target.generate(input_ids, **kw)
    out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=real_draft, nodes=16,
                          threshold=0.3, max_depth=6, return_dict_in_generate=True, **kw)
    for b in range(len(rows)):
        assert torch.equal(out.sequences[b], ref[b]), b
    assert len(out.stats.rows) == len(rows)


@pytest.mark.one_end  # at the lowest end test_standin.py's stand-in writes SmolLM2's text
def test_smollm2_inflated_writes_smollm2s_text_and_the_shipped_drafts_draft_as_against_smollm2(smollm2):
    """SmolLM2 inflated (3.1x its parameters; hidden 1152, 32 layers): greedy output equal to
    SmolLM2's, and the shipped head and draft, loaded against it unchanged, accept what they accept
    against SmolLM2 (the same accepted lengths: they read the same features)."""
    from opttree import load_draft
    from opttree.bench.inflate import Shape, inflate

    target, tok = smollm2
    big = inflate(target, Shape(1152, 2048, 24, 6, 32))
    assert sum(p.numel() for p in big.parameters()) > 3 * sum(p.numel() for p in target.parameters())
    for folder in (SHIPPED_HEAD, SHIPPED_DRAFT):
        runs = {}
        for name, model in (("smollm2", target), ("inflated", big)):
            gen = SpeculativeGenerator(model, load_draft(folder, model), nodes=8, threshold=0.3)
            runs[name] = check_prompts((model, tok), gen, own_prompts()[:4])
        assert runs["inflated"] == runs["smollm2"], folder.name
        assert sum(runs["smollm2"]) / len(runs["smollm2"]) > 1.3  # control: the drafts are accepted
