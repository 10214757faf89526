"""A feature head drafting on fixed shapes, its forwards compiled (drafters/head/graph.py), where the
verification compiles: a GPU by default, here a CPU told to with CompileConfig's
``_compile_all_devices``. Its q equals the eager drafter's; the tree's positions and masks are right
(an oracle head is accepted all the way, and a drafter one position off is caught); greedy output
equals plain; and the counts a GPU cares about are pinned: one graph per width, none for a second
prompt length, every draft forward after the prefill through the compiled step, host reads and the
kernels outside the graphs per step no more than the eager drafter's."""

import logging
import sys
from pathlib import Path

import pytest
import torch
from transformers import CompileConfig

from models import peaked, tiny_model
from opttree import SpeculativeGenerator, speculative_generate
from opttree.distill.train.head import new_head
from opttree.drafters.head.drafter import FeatureHeadDrafter
from opttree.drafters.head.graph import HeadSteps
from opttree.tree import DraftTree
import test_feature_head  # its OffByOne, made a compiled drafter below
from test_feature_head import drafter_after, oracle_head, prompt, randomised, sharp_one_layer_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from overhead import PROMPT, stock_linears, tiny_pair  # noqa: E402

from opttree.tools.overhead import OverheadCounter  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles with a backend of its own (see test_compiled_verify.py's fixture)."""
    torch._dynamo.reset()
    yield


class Recorder:
    """A torch.compile backend that records each graph's long inputs' shapes; CompileConfig deep-copies
    its backend, so the copies share the record."""

    def __init__(self):
        self.graphs = []

    def __deepcopy__(self, memo):
        return self

    def __call__(self, gm, example_inputs):
        self.graphs.append(tuple(tuple(t.shape) for t in example_inputs
                                 if isinstance(t, torch.Tensor) and t.dtype == torch.long))
        return gm.forward

    def draft_widths(self, start: int = 0) -> list[int]:
        """The widths of the draft step's graphs (three [w] long inputs: tokens, positions, slots)."""
        return [g[0][0] for g in self.graphs[start:] if len(g) == 3 and all(len(s) == 1 for s in g)]


def forced(backend="eager") -> CompileConfig:
    config = CompileConfig(backend=backend, mode=None)
    config._compile_all_devices = True  # what generate() reads to compile on any device
    return config


def compiled_drafter(head, target, room=64) -> FeatureHeadDrafter:
    return head.for_target(target).compiled(forced(), room)


def spec(target, draft, ids, **kw):
    return target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                           return_dict_in_generate=True, **kw)


@pytest.mark.parametrize("layers, room", [(1, 64), (2, 64), (1, 8)])
def test_the_compiled_drafter_drafts_the_eager_drafters_q(layers, room):
    """Root, tree layers of every width, commits and the next step's catch-up: the same q. room=8:
    buffers too small for the call, grown on the way."""
    target = tiny_model("llama", seed=0)
    head = randomised(new_head(target, num_layers=layers)[0], seed=3)
    ids = prompt(2)
    eager, root = drafter_after(head, target, ids)
    fixed, fixed_root = drafter_after(compiled_drafter(head, target, room), target, ids)
    torch.testing.assert_close(fixed_root, root, rtol=1e-4, atol=1e-6)
    pool = DraftTree(torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.tensor([-1, -1, -1, 0, 0, 1, 3]), torch.ones(7))
    sequence = ids[0]
    for step in range(3):
        for frontier in ([0, 1, 2], [3, 4, 5], [6]):
            expected = eager.expand(pool, torch.tensor(frontier))
            torch.testing.assert_close(fixed.expand(pool, torch.tensor(frontier)), expected, rtol=1e-4, atol=1e-6)
        for d in (eager, fixed):
            d.commit([0, 3])
        accepted = torch.tensor([int(pool.tokens[0]), int(pool.tokens[3]), 40 + step])
        with torch.no_grad():
            feats = target(torch.cat([sequence, accepted[:-1]])[None], output_hidden_states=True).hidden_states[-1][0]
        sequence = torch.cat([sequence, accepted])
        for d in (eager, fixed):
            d.add_features(feats[-3:])
        torch.testing.assert_close(fixed.root_probs(sequence), eager.root_probs(sequence), rtol=1e-4, atol=1e-6)
    assert fixed.buffers.slots >= fixed.cached + 7


@pytest.mark.parametrize("broken", [False, True])
def test_the_compiled_oracle_tree_probs_are_the_targets_probs(broken):
    """Positions, rotary, the fixed cache's slots and the whole-buffer mask all right: each node's
    q is the target's. Negative control: nodes one position too early."""
    target = sharp_one_layer_target()
    head = oracle_head(target)
    drafter = compiled_drafter(head, target)
    if broken:
        drafter = test_feature_head.OffByOne(head, None, drafter.steps, drafter.buffers.slots)
    ids = prompt(1)
    pool = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, -1, 0, 2]), torch.ones(4))
    drafter, _ = drafter_after(drafter, target, ids)
    for frontier in ([0, 1], [2], [3]):
        probs = drafter.expand(pool, torch.tensor(frontier))
        for node, p in zip(frontier, probs):
            path = pool.path_to(node)
            with torch.no_grad():
                logits = target(torch.cat([ids, pool.tokens[path][None]], 1)).logits[0, -1]
            assert torch.allclose(p, logits.softmax(-1), atol=1e-5) != broken, node


def test_the_compiled_oracle_head_is_accepted_deep_into_the_tree():
    target = sharp_one_layer_target()
    ids = prompt(1)
    ref = target.generate(ids, max_new_tokens=40, do_sample=False)
    out = spec(target, oracle_head(target), ids, max_new_tokens=40, nodes=5, strategy="chain",
               compile_config=forced())
    assert torch.equal(out.sequences, ref)
    assert out.stats.accept_lengths[:-1] == [6] * (len(out.stats.accept_lengths) - 1)


@pytest.mark.parametrize("family, fixed", [("llama", True), ("qwen2", True), ("llama", False)])
def test_greedy_through_the_compiled_draft_equals_plain_and_compiles_one_graph_per_width(family, fixed, monkeypatch):
    """Negative control (fixed=False): buffers sized to each call's own room compile every width again
    for a second prompt length."""
    if not fixed:
        monkeypatch.setattr("opttree.drafters.head.drafter.cache_slots", lambda room: room)
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    target.generation_config.eos_token_id = None
    head = randomised(new_head(target)[0])
    recorder = Recorder()
    config = forced(recorder)
    ids = prompt(0)
    out = spec(target, head, ids, max_new_tokens=24, nodes=12, threshold=0.0, compile_config=config)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False))
    widths = recorder.draft_widths()
    assert widths and all(w & (w - 1) == 0 for w in widths), recorder.graphs  # padded widths
    assert len(widths) == len(set(widths)) or not fixed, recorder.graphs  # (buffers of the room itself grow)
    graphs = len(recorder.graphs)
    longer = prompt(1, length=14)  # another prompt length: the same buffer size, no graph of its own
    out = spec(target, head, longer, max_new_tokens=24, nodes=12, threshold=0.0, compile_config=config)
    assert torch.equal(out.sequences, target.generate(longer, max_new_tokens=24, do_sample=False))
    assert bool(set(recorder.draft_widths(graphs)) & set(widths)) != fixed, recorder.graphs[graphs:]


def test_sampling_through_the_compiled_draft_is_reproducible():
    """The warpers' q (the dense path of probs_of) from the compiled step; the same seed, the same text."""
    target = peaked(tiny_model("llama", seed=0), scale=3.0)
    target.generation_config.eos_token_id = None
    head = randomised(new_head(target)[0])
    ids = prompt(0)
    runs = [target.generate(ids, do_sample=True, top_k=20, temperature=0.8, max_new_tokens=16, nodes=8,
                            custom_generate=speculative_generate, draft_model=head, compile_config=forced(),
                            generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and runs[0].shape[1] == ids.shape[1] + 16


def test_where_the_verification_stays_eager_the_draft_does_too():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head = randomised(new_head(target)[0])
    recorder = Recorder()
    spec(target, head, prompt(0), max_new_tokens=8, nodes=6, compile_config=forced(recorder), disable_compile=True)
    spec(target, head, prompt(0), max_new_tokens=8, nodes=6)  # a CPU, no compile_config
    assert recorder.graphs == []


def test_a_width_whose_compile_fails_runs_eagerly_with_one_warning(caplog):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    target.generation_config.eos_token_id = None
    head = randomised(new_head(target)[0])

    class Broken:
        def __deepcopy__(self, memo):
            return self

        def __call__(self, gm, example_inputs):
            if any(isinstance(t, torch.Tensor) and t.dtype == torch.long and t.shape == (8,) for t in example_inputs):
                raise RuntimeError("no graph of 8 rows")
            return gm.forward

    ids = prompt(0)
    with caplog.at_level(logging.WARNING, logger="opttree.drafters.head.graph"):
        out = spec(target, head, ids, max_new_tokens=24, nodes=12, threshold=0.0, compile_config=forced(Broken()))
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False))
    warnings = [r for r in caplog.records if "compiled draft step of 8 rows failed" in r.getMessage()]
    assert len(warnings) == 1


@pytest.fixture
def step_spy(monkeypatch):
    """Every call of the draft step: (eager?) in order; while ``counter`` is set, the step counts as one
    launch (its ops are the graph's: the OverheadCounter's modes make dynamo run them one by one)."""
    state = {"calls": [], "counter": None}
    real = HeadSteps.__call__

    def spy(self, eager, *args):
        state["calls"].append(eager or args[5].shape[0] in self.failed)
        counter = state["counter"]
        if counter is None:
            return real(self, eager, *args)
        counter.inside += 1
        try:
            return real(self, eager, *args)
        finally:
            counter.inside -= 1

    monkeypatch.setattr(HeadSteps, "__call__", spy)
    return state


def test_the_compiled_step_counts(step_spy):
    """Per greedy step at nodes=60 (trees ~9 deep): host reads ≤ depth + 2 (measured depth + 1, as
    the eager drafter), no uploads, and kernels outside the graphs ≤ the eager drafter's bound
    (test_overhead: 310; measured 291, against 300 + ~51 per eager draft forward); every draft
    forward but the prefill's runs through the compiled step."""
    torch.set_num_threads(1)
    target, _ = tiny_pair(0)
    head, _ = new_head(target)
    config = forced()
    gen = SpeculativeGenerator(target, head, nodes=60, threshold=0.5, max_depth=10)
    with stock_linears():
        gen.generate(PROMPT, max_new_tokens=8, compile_config=config)  # warm-up: compiles
        step_spy["calls"].clear()
        with OverheadCounter(target, head) as counter:
            step_spy["counter"] = counter
            gen.generate(PROMPT, max_new_tokens=80, compile_config=config)
            step_spy["counter"] = None
    steps = gen.last_stats.steps
    depth = sum(s.tree_depth for s in steps) / len(steps)
    counts = counter.mean()
    assert depth >= 9
    assert counts.reads <= depth + 2 and counts.uploads == 0, counts
    assert counts.kernels <= 310, counts
    assert step_spy["calls"][0] and not any(step_spy["calls"][1:])  # the prefill eager, the rest compiled
    assert len(step_spy["calls"]) == sum(s.draft_forwards for s in steps)  # each a draft forward (the catch-ups too)


def test_auto_calibrates_through_the_compiled_draft_step(tmp_path, monkeypatch, step_spy):
    """nodes="auto": the scratch drafter timed at calibration is the compiled one, and decoding
    compiles no draft width calibration compiled already."""
    from opttree.budget import calibration

    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path))
    calibration.clear_calibrations()
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    target.generation_config.eos_token_id = None
    head = randomised(new_head(target)[0])
    recorder = Recorder()
    ids = prompt(0)
    out = spec(target, head, ids, max_new_tokens=16, nodes="auto", compile_config=forced(recorder))
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=16, do_sample=False))
    widths = recorder.draft_widths()
    assert len(widths) == len(set(widths)), widths  # no width compiled twice
    assert sum(1 for eager in step_spy["calls"] if eager) == 2  # the two prefills: calibration's and the call's
    assert len(list(tmp_path.glob("*.json"))) == 1
    calibration.clear_calibrations()
    assert type(head.for_target(target)) is FeatureHeadDrafter  # the head itself is untouched


@pytest.mark.gpu
def test_on_cuda_the_default_path_replays_the_heads_graphs_and_syncs_a_few_times():
    """On a GPU with no cache named and no compile_config: a static cache, the verification and the
    head's step compiled by generate()'s default (inductor, CUDA graphs); greedy equal to plain, the
    q equal to the eager drafter's, and about one synchronising call per drafted layer."""
    import warnings

    target = peaked(tiny_model("llama", seed=0), scale=300.0).to("cuda:0")
    target.generation_config.eos_token_id = None
    head = new_head(target)[0].to("cuda:0")
    ids = prompt(12).to("cuda:0")
    ref = target.generate(ids, max_new_tokens=60, do_sample=False)
    assert torch.equal(spec(target, head, ids, max_new_tokens=60, nodes=16).sequences, ref)  # compiles
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = spec(target, head, ids, max_new_tokens=60, nodes=16)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(out.sequences, ref)
    steps = len(out.stats.steps)
    depth = sum(s.tree_depth for s in out.stats.steps) / steps
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    assert syncs / steps <= depth + 6, (syncs, steps, depth)
    eager, root = drafter_after(head, target, ids)
    fixed, fixed_root = drafter_after(head.for_target(target).compiled(CompileConfig(), 64), target, ids)
    torch.testing.assert_close(fixed_root, root, rtol=1e-3, atol=1e-5)
