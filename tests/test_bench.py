"""opttree bench on tiny random models: records, the greedy-equality check, tables, plots, CLI."""

import json

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from models import VOCAB, peaked, tiny_model
from opttree import DraftTree
from opttree.loop import walking
from opttree.bench import Generated, Method, load_questions, run_bench, select_questions
from opttree.bench import cli, models as bench_models
from opttree.bench import methods as bench_methods
from opttree.bench.methods import StepRecorder, parse_tree_spec
from opttree.hf.compat import assisted_takes_static_cache
from opttree.bench.questions import messages_for, prompt_ids
from opttree.bench.runner import first_difference

PNG = b"\x89PNG\r\n\x1a\n"

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 2, "category": "qa", "turns": ["Why is the sky blue?"]},
]


class CharTokenizer:
    """Just enough of a tokenizer for the bench: a chat template, encode, decode (ids 3..92)."""

    chat_template = "fake"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        text = "".join(f"<{m['role'][0]}>{m['content']}" for m in messages)
        return text + ("<a>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return [3 + ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(33 + i % 90) for i in ids)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small run fastest on one thread (and ~10x slower on two busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    draft = peaked(tiny_model("llama", seed=0), scale=30.0)  # same weights: the draft is always right
    return target, draft


@pytest.fixture(scope="module")
def result(pair):
    target, draft = pair
    return run_bench(target, draft, CharTokenizer(), QUESTIONS, max_new_tokens=10, warmup=1, progress=False,
                     tree={"nodes": 8, "threshold": 0.1, "max_depth": 4})


def test_records_are_well_formed_and_equal_to_plain(result):
    assert result.methods == ["plain", "assisted", "lookup", "opttree"]
    assert len(result.records) == 3 * 4  # (2 + 1 turns) x 4 methods
    assert result.ok and result.exit_code == 0
    for r in result.records:
        assert r.new_tokens == len(r.tokens) == sum(r.accept_lengths) > 0
        assert r.wall_time > 0 and all(a >= 1 for a in r.accept_lengths)
        assert r.matches_plain is (None if r.method == "plain" else True)
        if r.method == "plain":
            assert set(r.accept_lengths) == {1}
        if r.method == "opttree":
            assert len(r.expected_lengths) == len(r.accepted) == len(r.tree_sizes) == r.steps
            assert [a + 1 for a in r.accepted][:-1] == r.accept_lengths[:-1]
    # every method saw the same prompt; turn 2 carries the plain answer to turn 1
    by_turn = {}
    for r in result.records:
        by_turn.setdefault((r.question_id, r.turn), set()).add(r.prompt_tokens)
    assert all(len(v) == 1 for v in by_turn.values())
    plain = {(r.question_id, r.turn): r for r in result.records if r.method == "plain"}
    turn2 = prompt_ids(CharTokenizer(), QUESTIONS[0]["turns"], [plain[(1, 0)].text])
    assert plain[(1, 1)].prompt_tokens == len(turn2) > plain[(1, 0)].prompt_tokens + plain[(1, 0)].new_tokens
    # an always-right draft is accepted: opttree and assisted take several tokens per step
    summary = {(s.group, s.method): s for s in result.summaries()}
    assert summary[("all", "opttree")].tau > 2 and summary[("all", "assisted")].tau > 2
    assert summary[("all", "plain")].tau == 1.0 and summary[("all", "plain")].speedup == pytest.approx(1.0)
    for s in summary.values():  # the decomposition that explains a speedup
        assert s.speedup == pytest.approx(s.tau / s.step_cost)
    tree, plain = summary[("all", "opttree")], summary[("all", "plain")]  # where a step's time goes
    assert 0 < tree.draft_ms and 0 < tree.verify_ms and tree.draft_ms + tree.verify_ms < tree.step_ms
    assert plain.draft_ms is None and plain.step_ms == pytest.approx(1e3 * plain.wall_time / plain.new_tokens)
    mine = [r for r in result.records if r.method == "opttree"]
    assert tree.verify_ms == pytest.approx(1e3 * sum(r.verify_seconds for r in mine) / sum(r.steps for r in mine))
    assert {s.group for s in result.summaries()} == {"mt_bench", "qa", "all"}


def test_files_tables_and_plots_are_written(result, tmp_path):
    written = result.write(tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and {"new_tokens", "wall_time", "accept_lengths", "matches_plain"} <= set(lines[0])
    answers = [json.loads(x) for x in (tmp_path / "answers" / "opttree.jsonl").read_text().splitlines()]
    assert [a["question_id"] for a in answers] == [1, 2]
    choice = answers[0]["choices"][0]
    assert len(choice["new_tokens"]) == len(choice["wall_time"]) == len(choice["turns"]) == 2
    assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
    summary = (tmp_path / "summary.md").read_text()
    assert "| `opttree` |" in summary and "| mt_bench | `assisted` |" in summary and "MISMATCH" not in summary
    steps = summary.split("## Where a step's time goes", 1)[1].split("\n## ", 1)[0]
    assert steps.count("| `") == 4 and "| `plain` | 1.00 |" in steps and "| – | – | – |" in steps  # plain: no split
    assert "torch_threads" in summary and json.loads((tmp_path / "header.json").read_text())["environment"]["torch"]
    for name in ("speedup_by_category.png", "accept_lengths.png", "expected_vs_accepted.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG, name


def broken(target):
    """plain generate() with its last token changed: a fast method with a wrong answer."""

    def generate(input_ids, max_new_tokens):
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                              max_new_tokens=max_new_tokens)
        out = out.clone()
        out[0, -1] = (out[0, -1] + 1) % 96
        return Generated(out, [1] * (out.shape[1] - input_ids.shape[1]))

    return Method("broken", generate)


def test_equality_check_fails_loudly(pair, tmp_path):
    target, _ = pair
    result = run_bench(target, None, CharTokenizer(), QUESTIONS[1:], methods=["plain", "lookup", broken(target)],
                       max_new_tokens=6, warmup=0, progress=False)
    assert not result.ok and result.exit_code == 1
    (bad,) = result.mismatches
    assert bad.method == "broken" and bad.first_mismatch == bad.new_tokens - 1
    assert bad.verdict == "mismatch" and bad.ties == [] and not result.ties
    assert all(r.matches_plain for r in result.records if r.method == "lookup")
    text = result.markdown()
    assert "FAILED" in text and "✗ MISMATCH 1/1" in text and "✓ 1/1" in text
    result.write(tmp_path)
    assert (tmp_path / "speedup_by_category.png").read_bytes()[:8] == PNG


def tied_target(dtype, question):
    """A target whose LM head gives token 95 exactly the logit of plain's first answer token ``a`` to
    ``question``: plain's argmax takes ``a``, the lower of the two."""
    target = tiny_model("llama", seed=0, dtype=dtype)
    ids = torch.tensor([prompt_ids(CharTokenizer(), question["turns"][:1], [])])
    a = int(target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=1)[0, -1])
    assert a < VOCAB - 1
    with torch.no_grad():
        target.lm_head.weight[VOCAB - 1] = target.lm_head.weight[a]
    return target, a


def upward_ties(monkeypatch, ulps: int = 1):
    """opttree's argmax walk with token 95 ``ulps`` float32 units higher: it wins its exact ties (and
    near-ties within those units), as a last-bit difference of rounding would make it (and changes
    nothing else)."""
    real = walking.greedy_walk

    def walk(tree, logits, pool_ids, depth=None):  # logits: [n + 1, vocab] float32
        logits = logits.clone()
        for _ in range(ulps):
            logits[:, VOCAB - 1] = torch.nextafter(logits[:, VOCAB - 1], torch.tensor(float("inf")))
        return real(tree, logits, pool_ids, depth)

    monkeypatch.setattr(walking, "greedy_walk", walk)


def demoted(target):
    """plain generate() with its last token changed to the worst-scoring one: a clear error."""

    def generate(input_ids, max_new_tokens):
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                              max_new_tokens=max_new_tokens, output_scores=True, return_dict_in_generate=True)
        sequences = out.sequences.clone()
        sequences[0, -1] = out.scores[-1][0].argmin()
        return Generated(sequences, [1] * (sequences.shape[1] - input_ids.shape[1]))

    return Method("demoted", generate)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_near_ties_are_reported_and_pass_but_errors_fail(dtype, monkeypatch, tmp_path):
    """In every dtype, float32 included: a tie of plain's own top scores broken the other way is a
    reported near-tie and passes; a real error (the worst-scoring token) is a MISMATCH and fails."""
    target, a = tied_target(dtype, QUESTIONS[1])
    upward_ties(monkeypatch)
    result = run_bench(target, target, CharTokenizer(), QUESTIONS[1:], methods=["plain", "opttree", demoted(target)],
                       max_new_tokens=8, warmup=0, progress=False, tree={"nodes": 4})
    by_method = {r.method: r for r in result.records}
    tie = by_method["opttree"]
    assert tie.tokens[0] == VOCAB - 1 and not tie.matches_plain and tie.first_mismatch == 0
    assert tie.verdict == "tie" and tie.ties[0]["step"] == 0 and tie.ties[0]["gap"] == 0.0
    assert (tie.ties[0]["expected"], tie.ties[0]["got"]) == (a, VOCAB - 1) and tie.ties[0]["bound"] > 0
    assert result.ties == [tie] and [r.method for r in result.mismatches] == ["demoted"]
    assert by_method["demoted"].verdict == "mismatch" and result.exit_code == 1
    text = result.markdown()
    assert "✓ 1/1 (1 near-tie)" in text and "✗ MISMATCH 1/1" in text and "## Near-ties" in text
    assert "FAILED: 1 turn(s) of demoted" in text
    # without the wrong method the run passes
    result = run_bench(target, target, CharTokenizer(), QUESTIONS[1:], methods=["plain", "opttree"],
                       max_new_tokens=8, warmup=0, progress=False, tree={"nodes": 4})
    assert result.ok and result.exit_code == 0 and len(result.ties) == 1
    result.write(tmp_path)
    assert json.loads((tmp_path / "records.jsonl").read_text().splitlines()[1])["verdict"] == "tie"


def test_an_engineered_float32_near_tie_is_a_tie_and_a_real_mismatch_still_fails(monkeypatch):
    """Not an exact tie: token 95's LM-head row moved off token a's by about 1e-7 in one weight, so that
    plain's own score of 95 is one or two float32 units below a's; the walk that prefers 95 by 4 units
    leaves plain there. The bench judges it by float32's bound: a tie, the run passes. The same run with
    a method that emits a far token fails (negative control)."""
    target, a = tied_target(torch.float32, QUESTIONS[1])
    ids = torch.tensor([prompt_ids(CharTokenizer(), QUESTIONS[1]["turns"][:1], [])])
    with torch.no_grad():
        h = target.model(ids).last_hidden_state[0, -1]  # [H], what the LM head reads at the first token
        k = int(h.abs().argmax())
        target.lm_head.weight[VOCAB - 1, k] -= 5e-8 / h[k]  # 95's logit 5e-8 below a's
    upward_ties(monkeypatch, ulps=4)
    result = run_bench(target, target, CharTokenizer(), QUESTIONS[1:], methods=["plain", "opttree", demoted(target)],
                       max_new_tokens=8, warmup=0, progress=False, tree={"nodes": 4})
    by_method = {r.method: r for r in result.records}
    tie = by_method["opttree"]
    assert tie.tokens[0] == VOCAB - 1 and tie.verdict == "tie", tie.verdict
    assert 0 < tie.ties[0]["gap"] <= tie.ties[0]["bound"] < 1e-5  # a float32-sized bound
    assert by_method["demoted"].verdict == "mismatch" and result.exit_code == 1
    assert [r.method for r in result.mismatches] == ["demoted"]


def test_hf_methods_under_the_cpu_kernels(pair):
    from opttree.bench import make_methods
    from opttree.kernels import linears

    target, draft = pair
    seen = []
    hook = target.register_forward_pre_hook(lambda *_: seen.append(linears.active()))
    try:
        result = run_bench(target, draft, CharTokenizer(), QUESTIONS[1:],
                           methods=make_methods(["plain", "plain-fast", "assisted-fast", "lookup-fast"], target, draft),
                           max_new_tokens=6, warmup=0, progress=False)
    finally:
        hook.remove()
    assert result.ok and result.methods == ["plain", "plain-fast", "assisted-fast", "lookup-fast"]
    assert seen.count(True) == len(seen) - 6  # all but plain's 6 forwards (1 prefill + 5 steps)
    with pytest.raises(ValueError, match="unknown method 'opttree-fast'"):
        make_methods(["opttree-fast"], target, draft)


def test_first_difference_and_helpers():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert parse_tree_spec("nodes=16, threshold=0.25,strategy=opt") == {"nodes": 16, "threshold": 0.25, "strategy": "opt"}
    assert parse_tree_spec("nodes=4,draft=2") == {"nodes": 4, "draft": "2"}  # a draft is a path, never a number
    with pytest.raises(ValueError):
        parse_tree_spec("nodes")
    recorder = StepRecorder()
    for length in (5, 8, 9):
        recorder(torch.zeros(1, length, dtype=torch.long), None)
    assert recorder.accept_lengths(4) == [1, 3, 1]


def test_question_selection(tmp_path):
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
            for i, c in enumerate(["writing", "writing", "coding", "qa", "qa", "rag"])]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    questions = load_questions(path)
    chosen = select_questions(questions, per_category=2)
    assert [(q.question_id, q.group) for q in chosen] == [(0, "mt_bench"), (2, "mt_bench"), (3, "qa"), (4, "qa"), (5, "rag")]
    assert [q.question_id for q in select_questions(questions, ["writing"])] == [0, 1]
    with pytest.raises(ValueError, match="known"):
        select_questions(questions, ["poetry"])
    with pytest.raises(FileNotFoundError, match="Spec-Bench"):
        load_questions(tmp_path / "missing.jsonl")
    assert [m["role"] for m in messages_for(["a", "b"], ["x"])] == ["user", "assistant", "user"]


def test_step_stats_carry_the_verified_tree(pair):
    from opttree import speculative_generate

    target, draft = pair
    ids = torch.tensor([[5, 9, 14, 20, 7]])
    out = target.generate(ids, do_sample=False, max_new_tokens=12, custom_generate=speculative_generate,
                          draft_model=draft, nodes=8, threshold=0.1, return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:].tolist()
    done = 0
    for step in out.stats.steps:
        assert isinstance(step.tree, DraftTree) and len(step.tree) == step.tree_size
        assert len(step.accepted_nodes) == step.accepted
        if step.accepted_nodes:  # the accepted nodes form a root-to-node path and carry the emitted tokens
            assert step.tree.path_to(step.accepted_nodes[-1]) == step.accepted_nodes
            n = min(step.accepted, step.emitted)
            assert step.tree.tokens[step.accepted_nodes].tolist()[:n] == new[done:done + n]
        done += step.emitted


def test_cli_runs_end_to_end_and_reports_mismatch_in_exit_code(pair, tmp_path, monkeypatch):
    target, draft = pair
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    monkeypatch.setattr(bench_models, "load_draft_model", lambda spec, t, dtype, device: draft)
    out = tmp_path / "out"
    code = cli.main(["--questions", str(path), "--draft", "x", "--quick", "--max-new-tokens", "6", "--no-progress",
                     "--methods", "plain,assisted,lookup,opttree,opttree-lookup", "--nodes", "6",
                     "--opttree", "nodes=3,threshold=0.2", "--out", str(out), "--device", "cpu"])
    assert code == 0
    summary = (out / "summary.md").read_text()
    assert "`opttree(nodes=3,threshold=0.2)`" in summary and "quick: True" in summary
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {r["method"] for r in records} == {"plain", "assisted", "lookup", "opttree", "opttree-lookup",
                                              "opttree(nodes=3,threshold=0.2)"}
    assert max(len(r["accept_lengths"]) for r in records) <= 6  # --max-new-tokens beat --quick's 16
    # a category the file lacks is a usage error (exit code 2), before any model is loaded
    with pytest.raises(SystemExit) as error:
        cli.main(["--questions", str(path), "--categories", "poetry"])
    assert error.value.code == 2


def test_truncated_draft_is_a_copy_of_the_first_layers(pair):
    target, _ = pair
    draft = bench_models.load_draft_model("truncated:1", target)
    assert draft.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 2
    assert torch.equal(draft.model.layers[0].self_attn.q_proj.weight, target.model.layers[0].self_attn.q_proj.weight)
    assert draft.model.layers[0].self_attn.q_proj.weight.data_ptr() != target.model.layers[0].self_attn.q_proj.weight.data_ptr()


def test_report_describes_a_mixed_feature_head_draft():
    from opttree.bench.report import _model_info
    from opttree.distill.train.head import new_head
    from opttree.drafters import MixedDrafter

    head, _ = new_head(tiny_model("llama", seed=0))
    info = _model_info(MixedDrafter(head.to(torch.bfloat16)))
    assert info["class"] == "MixedDrafter(FeatureHead)"
    assert info["dtype"] == "torch.bfloat16" and info["parameters"] > 0


def test_draft_dtype_auto_is_chosen_and_named_in_the_header(pair, tmp_path, monkeypatch):
    from opttree.loading import dtype_probe
    from opttree.loading.dtype_probe import DtypeTimes
    from opttree.distill.train.head import new_head
    from opttree.loading.head_file import save_head

    target, _ = pair
    monkeypatch.setattr(dtype_probe, "probe_dtypes", lambda model, *a, **k: DtypeTimes(3e-3, 1e-3))  # bf16 3x faster
    draft = bench_models.load_draft_model("truncated:1", target, "auto")
    assert draft.dtype == torch.bfloat16 and target.dtype == torch.float32
    assert bench_models.dtype_words("auto", draft) == "bfloat16 (auto)"
    assert bench_models.dtype_words(None, draft) == "bfloat16" and bench_models.dtype_words("auto", None) is None
    head, meta = new_head(target, token_ids=torch.arange(40, 96))
    save_head(head, meta, tmp_path / "head")
    assert bench_models.load_draft_model(str(tmp_path / "head"), target, "auto").fc.weight.dtype == torch.bfloat16
    # the command line: --draft-dtype auto, the choice in the report's header
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(QUESTIONS[1]) + "\n")
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    out = tmp_path / "out"
    code = cli.main(["--questions", str(path), "--draft", "truncated:1", "--draft-dtype", "auto", "--quick",
                     "--max-new-tokens", "4", "--no-progress", "--no-plots", "--methods", "plain,opttree",
                     "--nodes", "3", "--out", str(out), "--device", "cpu"])
    assert code == 0
    assert json.loads((out / "header.json").read_text())["draft_dtype"] == "bfloat16 (auto)"
    assert "- draft_dtype: bfloat16 (auto)" in (out / "summary.md").read_text()



def test_an_extra_tree_drafts_with_its_own_draft(pair, tmp_path, monkeypatch):
    """``--opttree draft=PATH``: that method drafts with PATH's draft (loaded once, as --draft is), the others
    with --draft; the report names it. The draft that is always right accepts more than a wrong one (the
    control that each method used the draft it names); both outputs equal plain's."""
    target, right = pair
    wrong = peaked(tiny_model("llama", seed=1), scale=30.0)
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    loads = []

    def load(spec, t, dtype, device):
        loads.append(spec)
        return {"x": right, "y": wrong}[spec]

    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    monkeypatch.setattr(bench_models, "load_draft_model", load)
    out = tmp_path / "out"
    code = cli.main(["--questions", str(path), "--draft", "x", "--quick", "--max-new-tokens", "8", "--no-progress",
                     "--methods", "plain,opttree", "--nodes", "4", "--opttree", "draft=y", "--opttree",
                     "nodes=3,draft=y", "--out", str(out), "--device", "cpu", "--no-plots"])
    assert code == 0 and sorted(loads) == ["x", "y"]  # y once for both trees
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {r["method"] for r in records} == {"plain", "opttree", "opttree(draft=y)", "opttree(nodes=3,draft=y)"}
    assert all(r["verdict"] in ("equal", None) for r in records if r["method"] != "plain")

    def mean_accept(method):
        lengths = [n for r in records if r["method"] == method for n in r["accept_lengths"]]
        return sum(lengths) / len(lengths)

    assert mean_accept("opttree") > 2.0 > mean_accept("opttree(draft=y)")
    summary = (out / "summary.md").read_text()
    assert "- `opttree(draft=y)`: nodes=4," in summary and "verifier=match, draft=y;" in summary
    with pytest.raises(SystemExit) as error:  # a draft= that names no folder: refused before any model loads
        cli.main(["--questions", str(path), "--draft", "x", "--opttree", f"draft={tmp_path / 'none'}"])
    assert error.value.code == 2 and loads == ["x", "y"]


@pytest.fixture
def eager_backend(monkeypatch):
    """The compiled methods with dynamo's "eager" backend: the same graphs traced and counted, no
    Inductor code generated (seconds, not minutes, on a CPU)."""
    from opttree.bench import methods as bench_methods

    monkeypatch.setitem(bench_methods.COMPILE_BACKEND, "backend", "eager")


def test_the_compiled_methods_compile_in_the_warm_up_only_and_equal_plain(pair, eager_backend):
    """plain-compiled, assisted-compiled and opttree-compiled: a static cache of one size for every
    prompt, compiled on the CPU too; every graph is made in the warm-up (reported with its seconds),
    none while timed across prompts of different lengths, and the outputs equal plain's."""
    torch._dynamo.reset()
    target, draft = pair
    assisted = ["assisted-compiled"] if assisted_takes_static_cache() else []  # refused on an older transformers (below)
    result = run_bench(target, draft, CharTokenizer(), QUESTIONS, max_new_tokens=8, warmup=1, progress=False,
                       methods=["plain", "plain-compiled", *assisted, "opttree-compiled"],
                       tree={"nodes": 8, "threshold": 0.1, "max_depth": 4}, extra_trees=[{"nodes": 4, "compiled": 1}])
    assert result.ok and {r.verdict for r in result.records if r.method != "plain"} == {"equal"}
    assert len({r.prompt_tokens for r in result.records}) == 3  # three prompt lengths
    warm = result.header["warmup"]
    assert "opttree-compiled(nodes=4)" in result.methods
    for name in ("plain-compiled", *assisted, "opttree-compiled", "opttree-compiled(nodes=4)"):
        # it did compile; but the extra tree verifies at its one size, 8 rows, which may replay the graph dynamo
        # made dynamic once the methods before it ran other row counts (plain's 1, the tree's 16, assisted's)
        shares = name == "opttree-compiled(nodes=4)"
        assert warm[name]["graphs_compiled"] >= (0 if shares else 1), name
        assert warm[name]["seconds"] > 0
        assert sum(r.graphs_compiled for r in result.records if r.method == name) == 0, name  # and never again
        settings = result.header["methods"][name]
        assert settings["cache"] == "static" and settings["max_cache_len"] % 256 == 0
    assert warm["plain"]["graphs_compiled"] == 0  # control: eager plain compiles nothing
    text = result.markdown()
    assert "`plain-compiled`: " in text and "graphs compiled), 0 graphs compiled while timed" in text


@pytest.mark.parametrize("refused", [True, False])
def test_assisted_compiled_is_refused_by_name_where_transformers_refuses_a_static_cache(pair, monkeypatch, refused):
    """transformers before 5.24 raises inside assisted generation on a static cache: the bench refuses
    the method up front, naming the version it needs and the fix; where it is new enough it builds it.
    The installed version is made older or newer than the one needed by moving the bound."""
    from opttree.hf import compat

    target, draft = pair
    monkeypatch.setattr(compat, "ASSISTED_STATIC_FROM", "999.0.0" if refused else "0.0.1")
    if refused:
        with pytest.raises(ValueError, match=r"'assisted-compiled' needs transformers >= 999\.0\.0.*drop it"):
            bench_methods.make_methods(["assisted-compiled"], target, draft)
    else:
        assert [m.name for m in bench_methods.make_methods(["assisted-compiled"], target, draft)] == ["assisted-compiled"]


def test_a_stand_in_target_spec_names_its_size():
    assert bench_models.split_size("smollm2:7b") == ("smollm2", "7b")
    assert bench_models.split_size("smollm2:1b") == ("smollm2", "1b")
    assert bench_models.split_size("/models/x:hidden_size=8") == ("/models/x", "hidden_size=8")
    assert bench_models.split_size("smollm2") == ("smollm2", None)
    assert bench_models.split_size("C:/models/x") == ("C:/models/x", None)  # a path is not a size


def test_the_cli_writes_each_record_as_its_turn_is_judged(pair, tmp_path, monkeypatch):
    """A run cut short keeps its records: each is appended to records.partial.jsonl as it comes."""
    target, draft = pair
    from opttree.bench import runner

    seen = []  # lines in the partial file after each record
    real = runner.run_bench

    def spy(*args, on_record=None, **kwargs):
        def both(record):
            on_record(record)
            seen.append(len((tmp_path / "out" / "records.partial.jsonl").read_text().splitlines()))
        return real(*args, on_record=both, **kwargs)

    monkeypatch.setattr(runner, "run_bench", spy)
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    monkeypatch.setattr(bench_models, "load_draft_model", lambda spec, target, dtype, device: draft if spec else None)
    code = cli.main(["--questions", str(write_questions(tmp_path)), "--draft", "x", "--methods", "plain,opttree",
                     "--nodes", "4", "--max-new-tokens", "6", "--warmup", "0", "--out", str(tmp_path / "out"),
                     "--no-plots", "--no-progress"])
    assert code == 0
    assert seen == list(range(1, len(seen) + 1)) and len(seen) == 2 * 3  # one line more per record
    assert not (tmp_path / "out" / "records.partial.jsonl").exists()  # the full file replaces it at the end
    assert len((tmp_path / "out" / "records.jsonl").read_text().splitlines()) == 6


def write_questions(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path
