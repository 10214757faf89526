"""The verification forward compiled where generate() compiles plain decoding (hf/compiled.py): a
static cache and a device generate() compiles for (a CPU here, forced with CompileConfig's
``_compile_all_devices``, which generate() itself reads). Outputs equal plain greedy; every compiled
graph has one of the fixed verification sizes; a compile that fails falls back to eager with one
warning; and where generate() would not compile (a CPU by default, a dynamic cache,
``disable_compile``) nothing is compiled."""

import logging

import pytest
import torch
from transformers import CompileConfig, StaticCache

from models import peaked, tiny_model
from opttree import speculative_generate
from opttree.hf.compat import GENERATE_CACHE_NAME, with_cache
from opttree.hf.compiled import VerifyForward
from opttree.tree.sizes import VERIFY_SIZES

PROMPT = torch.tensor([[5, 17, 33, 2, 41, 8, 19, 60, 11]])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles with a backend of its own, and dynamo counts every backend change as a
    recompile of the same code (the tiny models' forward): past its recompile_limit (8 in a process
    that ran other tests' compiles) it runs eagerly and calls no backend, and a test counting
    graphs would count none. Each test starts with dynamo's caches empty."""
    torch._dynamo.reset()
    yield


def sharp(family: str):
    model = peaked(tiny_model(family), 30.0)
    model.generation_config.eos_token_id = None
    return model


def forced(backend) -> CompileConfig:
    config = CompileConfig(backend=backend, mode="default" if backend == "inductor" else None)
    config._compile_all_devices = True  # what generate() reads to compile on any device
    return config


def decode(target, draft, **kw):
    return target.generate(PROMPT, max_new_tokens=16, do_sample=False, cache_implementation="static",
                           custom_generate=speculative_generate, draft_model=draft, nodes=5, threshold=0.0,
                           return_dict_in_generate=True, **kw)


class Recorder:
    """A torch.compile backend that records the rows (input_ids' length) of each graph it compiles.
    CompileConfig deep-copies its backend, so the record is a list shared by the copies."""

    def __init__(self):
        self.rows = []

    def __deepcopy__(self, memo):
        return self

    def __call__(self, gm, example_inputs):
        ids = [t for t in example_inputs if isinstance(t, torch.Tensor) and t.dtype == torch.long and t.dim() == 2]
        self.rows.append(ids[0].shape[1] if ids else None)
        return gm.forward


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_compiled_verification_equals_plain_and_compiles_only_fixed_sizes(family):
    target = sharp(family)
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    recorder = Recorder()
    out = decode(target, target, compile_config=forced(recorder))
    assert torch.equal(out.sequences, plain)
    assert out.stats.mean_accepted_tokens > 2.0
    sizes = [r for r in recorder.rows if r is not None]
    assert sizes and set(sizes) <= set(VERIFY_SIZES), recorder.rows  # graphs at fixed sizes only


def test_a_fixed_tree_compiles_one_graph_whatever_its_trees_sizes():
    """nodes=6 over a compiled verification: every step verifies at the budget's size (8 rows), a smaller tree
    padded to it, so one graph serves the call and none compiles mid-answer. A draft of other weights and a
    threshold make the trees' sizes vary (control: unpadded, they would need several sizes)."""
    from opttree.tree.sizes import padded_size

    target, draft = sharp("llama"), peaked(tiny_model("llama", seed=3), 30.0)
    plain = target.generate(PROMPT, max_new_tokens=24, do_sample=False)
    recorder = Recorder()
    out = target.generate(PROMPT, max_new_tokens=24, do_sample=False, cache_implementation="static",
                          custom_generate=speculative_generate, draft_model=draft, nodes=6, threshold=0.3,
                          return_dict_in_generate=True, compile_config=forced(recorder))
    assert torch.equal(out.sequences, plain)
    assert recorder.rows == [8], recorder.rows
    assert len({padded_size(n + 1) for n in out.stats.tree_sizes}) > 1, out.stats.tree_sizes  # control


def test_the_inductor_compiled_verification_equals_plain():
    target = sharp("llama")
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    assert torch.equal(decode(target, target, compile_config=forced("inductor")).sequences, plain)


def test_a_compile_that_fails_falls_back_to_eager_with_one_warning(caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile here")

    target = sharp("llama")
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="opttree.hf.compiled"):
        out = decode(target, target, compile_config=forced(broken))
    assert torch.equal(out.sequences, plain)
    warnings = [r for r in caplog.records if r.name == "opttree.hf.compiled"]
    rows = {r.args[0] for r in warnings}
    assert warnings and len(warnings) == len(rows)  # one warning per size, never one per step
    assert all("running it eagerly" in r.getMessage() for r in warnings)


def test_a_failure_half_way_rewinds_the_static_cache_before_the_eager_run():
    """The compiled call fails after writing the cache (a runtime error of compiled code): the eager
    run must write the same slots again. Negative control: without the rewind the count is off."""
    from opttree.hf import kv_cache

    target = sharp("llama")
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)

    def writes_then_fails(**kwargs):
        target(**{**kwargs, "input_ids": torch.zeros_like(kwargs["input_ids"])})  # other keys written, count moved on
        raise RuntimeError("compiled code failed after its writes")

    forward = VerifyForward(target, writes_then_fails)
    assert forward.compiles
    out = decode_with(target, forward)
    assert torch.equal(out, plain) and forward.failed
    forward = VerifyForward(target, writes_then_fails)
    real = kv_cache.rewind
    kv_cache.rewind = lambda cache, length: None
    try:
        try:
            stale = decode_with(target, forward)
        except IndexError:  # the stale count runs the writes off the cache's end
            stale = None
    finally:
        kv_cache.rewind = real
    assert stale is None or not torch.equal(stale, plain)


def decode_with(target, forward: VerifyForward) -> torch.Tensor:
    """A static-cache decode whose verification forward is ``forward``."""
    import opttree.integration.prepare as preparation

    real = preparation.VerifyForward.of
    preparation.VerifyForward.of = classmethod(lambda cls, *args: forward)
    try:
        return decode(target, target).sequences
    finally:
        preparation.VerifyForward.of = real


@pytest.fixture
def compiles_seen(monkeypatch) -> list[bool]:
    """Whether each generate() call's verification forward compiles, in call order."""
    seen = []
    real = VerifyForward.of.__func__

    def spy(cls, *args):
        forward = real(cls, *args)
        seen.append(forward.compiles)
        return forward

    monkeypatch.setattr(VerifyForward, "of", classmethod(spy))
    return seen


@pytest.mark.parametrize("kw", [{}, {"disable_compile": True, "compile_config": "forced"}, {"dynamic": True}])
def test_where_generate_would_not_compile_nothing_is_compiled(kw, compiles_seen):
    """A CPU by default; disable_compile=True; a dynamic cache (no cache_implementation)."""
    target = sharp("llama")
    seen = compiles_seen
    args = dict(max_new_tokens=6, do_sample=False, custom_generate=speculative_generate, draft_model=target, nodes=3)
    if kw.get("compile_config") == "forced":
        args.update(compile_config=forced(Recorder()), disable_compile=True, cache_implementation="static")
    elif not kw:
        args.update(cache_implementation="static")
    target.generate(PROMPT, **args)
    assert seen == [False]
    if not kw:  # control: the same call, forced, does compile
        seen.clear()
        target.generate(PROMPT, **{**args, "compile_config": forced(Recorder())})
        assert seen == [True]


@pytest.mark.gpu
def test_on_cuda_a_static_cache_compiles_the_verification_as_generate_compiles_plain(compiles_seen):
    """generate()'s own default on a GPU: a static cache compiles decoding (mode "reduce-overhead":
    CUDA graphs); opttree's verification forwards go through the same callable, one graph per size."""
    target = sharp("llama").cuda()
    prompt = PROMPT.cuda()
    plain = target.generate(prompt, max_new_tokens=16, do_sample=False)
    out = target.generate(prompt, max_new_tokens=16, do_sample=False, cache_implementation="static",
                          custom_generate=speculative_generate, draft_model=target, nodes=5, threshold=0.0)
    assert compiles_seen == [True] and torch.equal(out, plain)


def test_with_no_cache_named_the_call_verifies_compiled_where_generate_would_compile(compiles_seen):
    """No cache_implementation=, a device generate() compiles for (here a CPU told to with
    _compile_all_devices, as a GPU is by default): opttree decodes on a static cache of its own and
    compiles its verification, on every way in. Two prompts of other lengths share the cache's size,
    so the second compiles no graph of a size the first compiled. Controls: a cache object the user
    passes, disable_compile=True and a batch keep the dynamic cache, eager."""
    from opttree import SpeculativeGenerator, speculative
    from opttree.hf.compiled import cache_slots

    target = sharp("llama")
    recorder = Recorder()
    config = forced(recorder)
    args = dict(max_new_tokens=12, do_sample=False, draft_model=target, nodes=5, threshold=0.0,
                compile_config=config, return_dict_in_generate=True)
    first = target.generate(PROMPT, custom_generate=speculative_generate, **args)
    assert compiles_seen == [True] and torch.equal(first.sequences, target.generate(PROMPT, max_new_tokens=12))
    cache = getattr(first, GENERATE_CACHE_NAME)  # .cache (.past_key_values before transformers renamed it)
    assert type(cache).__name__ == "StaticCache"
    assert cache.layers[0].max_cache_len == cache_slots(PROMPT.shape[1] + 12 + 8)
    compiled_sizes, graphs = set(recorder.rows), len(recorder.rows)
    longer = torch.cat([PROMPT, PROMPT[:, :5]], dim=1)  # 14 tokens: the same cache size
    out = target.generate(longer, custom_generate=speculative_generate, **args)
    assert torch.equal(out.sequences, target.generate(longer, max_new_tokens=12))
    assert getattr(out, GENERATE_CACHE_NAME).layers[0].max_cache_len == cache.layers[0].max_cache_len
    assert not compiled_sizes & set(recorder.rows[graphs:]), recorder.rows  # no size compiled twice
    gen = SpeculativeGenerator(target, target, nodes=5, threshold=0.0)
    gen.generate(PROMPT, max_new_tokens=6, compile_config=config)
    speculative(target).generate(PROMPT, **args)
    assert compiles_seen[-2:] == [True, True]  # the other two ways in
    from transformers import DynamicCache

    compiles_seen.clear()
    mine = DynamicCache(config=target.config)
    target.generate(PROMPT, custom_generate=speculative_generate, **{**args, GENERATE_CACHE_NAME: mine})
    target.generate(PROMPT, custom_generate=speculative_generate, **args, disable_compile=True)
    batch = torch.cat([PROMPT, PROMPT])
    target.generate(batch, attention_mask=torch.ones_like(batch), custom_generate=speculative_generate, **args)
    assert compiles_seen == [False, False, False] and len(mine) > 0  # the user's cache was the one filled


def inference_kinds(cache) -> list[tuple[str, bool]]:
    """Which of a static cache's tensors are inference tensors, layer by layer (what a graph guards on)."""
    return [(name, value.is_inference()) for layer in cache.layers for name, value in sorted(vars(layer).items())
            if isinstance(value, torch.Tensor)]


def test_a_graph_calibration_compiled_serves_decoding_as_it_is():
    """Calibration's forward of a size compiles the graph decoding's forwards of that size then run: its
    inputs are inference tensors and its static cache ordinary ones, as decoding's are (a graph guards on
    that: "dispatch key set mismatch" in TORCH_LOGS=recompiles). The test below checks it through a
    whole call, but only when decoding happens to use a size calibration timed (it failed 2 runs in 6);
    this one always does. Control: inputs that are no inference tensors compile again."""
    from opttree.budget.timing import VerifyRig
    from opttree.hf.compiled import target_forward

    target, recorder = sharp("llama"), Recorder()
    forward = VerifyForward(target, target.get_compiled_call(forced(recorder)))
    rig = VerifyRig(target, 32, forward=forward)
    decoding = StaticCache(config=target.config, max_cache_len=64)  # as integration/prepare.py opens one
    with torch.inference_mode():  # and step 0's prefill fills it
        target(input_ids=PROMPT, **with_cache(target, decoding), use_cache=True)
    assert inference_kinds(rig.cache) == inference_kinds(decoding)
    rig.run(15)  # a 16-row forward, as calibration times it
    assert recorder.rows == [16]
    rig.inputs.clear()
    with torch.inference_mode():  # decoding builds its inputs and runs its forward in inference mode
        target_forward(target, rig._inputs(15), rig.cache, False, forward=forward)
    assert recorder.rows == [16]  # no second graph
    with torch.no_grad():
        rig.inputs.clear()
        inputs = rig._inputs(15)
    with torch.inference_mode():  # control
        target_forward(target, inputs, rig.cache, False, forward=forward)
    assert recorder.rows == [16, 16]


def test_auto_calibrates_through_the_compiled_forward_and_decoding_reuses_its_graphs(tmp_path, monkeypatch):
    """nodes="auto" where the verification compiles: calibration times the compiled forward (its graphs,
    on a static cache of a short call's size), its file says so, and the call's decoding compiles no
    graph of a size calibration compiled. Control: the same call eager times eagerly ("eager" key)."""
    from opttree.budget import calibration, timing

    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path))
    calibration.clear_calibrations()
    target = sharp("llama")
    recorder = Recorder()
    seen = []
    real = timing.measure_verify_budgeted

    def spy(*args, **kwargs):
        before = len(recorder.rows)
        table = real(*args, **kwargs)
        seen.append((timing.forward_kind(kwargs.get("forward")), recorder.rows[before:]))
        return table

    monkeypatch.setattr(timing, "measure_verify_budgeted", spy)
    out = target.generate(PROMPT, max_new_tokens=12, do_sample=False, custom_generate=speculative_generate,
                          draft_model=target, compile_config=forced(recorder))
    assert torch.equal(out, target.generate(PROMPT, max_new_tokens=12))
    (kind, calibrated), = seen
    assert kind == "compiled" and calibrated and set(calibrated) <= set(VERIFY_SIZES), recorder.rows
    assert not set(calibrated) & set(recorder.rows[len(calibrated):]), (calibrated, recorder.rows)  # decoding compiled none of those again
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and '"forward": "compiled"' in files[0].read_text()
    calibration.clear_calibrations()
    target.generate(PROMPT, max_new_tokens=12, do_sample=False, custom_generate=speculative_generate,
                    draft_model=target)  # a CPU by default: eager
    assert [k for k, _ in seen] == ["compiled", "eager"] and len(list(tmp_path.glob("*.json"))) == 2


@pytest.mark.parametrize("same_slots", [True, False])
def test_compiled_auto_compiles_no_graph_while_decoding(same_slots, tmp_path, monkeypatch):
    """nodes="auto" over a compiled verification: calibration compiles the sizes it times, on a static cache as
    long as decoding's (a user's of 128 slots here, not a short call's MIN_SLOTS: a graph is made for one cache
    length), and decoding compiles no graph: it verifies only at those sizes (budget.latency, ``measured_only``).
    Calibration is held to two sizes, as a CPU's budget holds about two at a 1 B target; the draft is the target,
    so every node is right and an unbounded auto would want every size. Control (``same_slots=False``):
    calibration on a MIN_SLOTS cache, as before; decoding compiles its sizes again."""
    from opttree.budget import calibration, timing
    from opttree.integration import prepare

    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path))
    calibration.clear_calibrations()
    if not same_slots:
        monkeypatch.setattr(prepare, "decoding_slots", lambda cache, need: None)
    target, recorder = sharp("llama"), Recorder()
    real, calibrated = timing.measure_verify_budgeted, []

    def two_sizes(*args, **kwargs):
        table = real(*args, **{**kwargs, "order": (0, 15)})
        calibrated.extend(recorder.rows)
        return table

    monkeypatch.setattr(timing, "measure_verify_budgeted", two_sizes)
    timing._WARMED.clear()
    warmed = []
    real_warm = calibration.warm_compiled
    monkeypatch.setattr(calibration, "warm_compiled", lambda *a, **k: warmed.append(real_warm(*a, **k)) or warmed[-1])
    cache = StaticCache(config=target.config, max_cache_len=128)
    out = target.generate(PROMPT, max_new_tokens=40, do_sample=False, custom_generate=speculative_generate,
                          draft_model=target, compile_config=forced(recorder), return_dict_in_generate=True,
                          **{GENERATE_CACHE_NAME: cache})
    assert torch.equal(out.sequences, target.generate(PROMPT, max_new_tokens=40, do_sample=False))
    assert sorted(set(calibrated)) == [1, 16], recorder.rows
    assert set(out.stats.tree_sizes) <= {0, 15}, out.stats.tree_sizes  # only the sizes calibration compiled
    decoding = recorder.rows[len(calibrated):]
    if same_slots:
        assert decoding == [], recorder.rows  # no graph compiled while decoding
        assert warmed == [[]]  # calibration's own forwards warmed them: none run again
    else:
        assert decoding, recorder.rows  # control: the graphs of a MIN_SLOTS cache do not serve 128 slots


@pytest.mark.parametrize("warm", [True, False])
def test_a_calibration_read_from_its_file_compiles_its_sizes_before_the_first_step(warm, tmp_path, monkeypatch):
    """A compiled call whose calibration is read from its file (a new process: no graph compiled yet) compiles the
    sizes it will verify at before its first step (``timing.warm_compiled``), once per process and cache length, so
    none compiles mid-answer. Control (``warm=False``): without it, decoding compiles them at its first steps."""
    from opttree.budget import calibration, timing

    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path))
    calibration.clear_calibrations()
    target, recorder = sharp("llama"), Recorder()
    real = timing.measure_verify_budgeted
    monkeypatch.setattr(timing, "measure_verify_budgeted", lambda *a, **k: real(*a, **{**k, "order": (0, 15)}))

    def call():
        cache = StaticCache(config=target.config, max_cache_len=128)
        return target.generate(PROMPT, max_new_tokens=40, do_sample=False, custom_generate=speculative_generate,
                               draft_model=target, compile_config=forced(recorder), return_dict_in_generate=True,
                               **{GENERATE_CACHE_NAME: cache})

    call()  # measures, writes the file
    calibration.clear_calibrations()  # as a new process: the file is read, no graph is compiled, nothing warmed
    torch._dynamo.reset()
    timing._WARMED.clear()
    recorder.rows.clear()
    measured, warmed = [], []
    monkeypatch.setattr(timing, "measure_verify_budgeted", lambda *a, **k: measured.append(1))
    real_warm = calibration.warm_compiled

    def spy(*args, **kwargs):
        sizes = real_warm(*args, **kwargs) if warm else []
        warmed.append((sizes, len(recorder.rows)))
        return sizes

    monkeypatch.setattr(calibration, "warm_compiled", spy)
    out = call()
    assert torch.equal(out.sequences, target.generate(PROMPT, max_new_tokens=40, do_sample=False))
    (sizes, before), = warmed
    assert measured == [] and set(out.stats.tree_sizes) <= {0, 15}
    if warm:
        assert sizes == [0, 15] and sorted(recorder.rows) == [1, 16] and recorder.rows[before:] == [], recorder.rows
        again = call()  # the same process and cache length: nothing run again
        assert warmed[-1][0] == [] and torch.equal(again.sequences, out.sequences)
    else:
        assert recorder.rows[before:], recorder.rows  # control: compiled mid-answer
