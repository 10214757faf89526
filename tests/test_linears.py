"""The linears' kernels (opttree.kernels.linears) give F.linear's results, take the kernel chosen for their
shape (in "auto" mode: the fastest of the candidates timed inside the forwards, per thread count), and
only for the linears of the thread that opened a block: torch.nn.functional.linear itself is never
replaced, other threads keep the stock path, someone else's patch of it survives, and models no kernel
can help get no block. No test depends on which kernel is fastest on the machine that runs it, nor on
its load: the chooser runs on a fake clock (its declared ``clock``) that only the tests' kernels advance,
and the choice logic is tested with kernels made slow on that clock on purpose."""

import threading

import pytest
import torch

from clocks import HANG_GUARD, FakeClock
from opttree.kernels import linears
from opttree.kernels.choice import Chooser
from opttree.kernels.linears import MAX_ROWS, TRIALS, fast_linear, fast_linears

ORIGINAL = torch.nn.functional.linear
REAL_KERNELS = dict(linears._KERNEL)


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> FakeClock:
    """The default kernel mode, and a fresh chooser (no choices or trials carried in from other tests) on a
    fake clock: it stands still unless a test's kernel advances it (every trial then ties, and stock,
    the first candidate, keeps the key)."""
    monkeypatch.delenv("OPTTREE_LINEAR", raising=False)  # the default, whatever the caller's shell says
    clock = FakeClock()
    monkeypatch.setattr(linears, "_choice", Chooser(clock=clock))
    monkeypatch.setattr(linears, "_KERNEL", dict(REAL_KERNELS))
    return clock


def count_calls(monkeypatch, kernel: str) -> list[tuple[str, tuple]]:
    """(thread name, weight shape) of every product ``kernel`` computes from now on."""
    calls = []
    real = linears._KERNEL[kernel]

    def recorded(flat, weight, bias):
        calls.append((threading.current_thread().name, tuple(weight.shape)))
        return real(flat, weight, bias)

    monkeypatch.setitem(linears._KERNEL, kernel, recorded)
    return calls


ALL = [(k, d) for d in (torch.float32, torch.bfloat16) for k in linears.candidates(d, rows=1)]  # what runs here


@pytest.mark.parametrize("kernel, dtype", ALL, ids=lambda v: str(v).removeprefix("torch."))
@pytest.mark.parametrize("shape", [(1, 16), (1, 1, 16), (2, 16), (1, 3, 16), (5, 16), (2, 4, 16), (9, 16), (64, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_every_kernel_equals_f_linear(kernel, dtype, shape, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(dtype)
    w = torch.randn(300, 16, generator=g).to(dtype)
    b = torch.randn(300, generator=g).to(dtype) if bias else None
    out = fast_linear(x, w, b, auto=False, kernel=kernel)
    assert out.shape == (*shape[:-1], 300) and out.dtype == dtype
    assert out.is_contiguous()  # F.linear's layout: a model may view the rows (Llama 4's rotary, view_as_complex)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # two GEMMs' rounding: float32, bfloat16 (2^-7 relative)
    torch.testing.assert_close(out.float(), ORIGINAL(x, w, b).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_auto_gives_f_linears_results_while_trying_and_after(dtype):
    x, w, b = torch.randn(3, 16).to(dtype), torch.randn(40, 16).to(dtype), torch.randn(40).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for _ in range(len(linears.candidates(dtype, 3)) * TRIALS + 2):
        torch.testing.assert_close(fast_linear(x, w, b).float(), ORIGINAL(x, w, b).float(), rtol=tol, atol=tol)
    assert set(linears.decisions()) == {(dtype, torch.get_num_threads(), 3, 40, 16)}


@pytest.mark.parametrize("x, w", [
    (torch.randn(MAX_ROWS + 1, 8), torch.randn(4, 8)),  # too many rows (a prefill)
    (torch.randn(3, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)),  # no kernel for float64
    (torch.randn(3, 8, dtype=torch.float16), torch.randn(4, 8, dtype=torch.float16)),
    (torch.randn(3, 8), torch.randn(4, 8, dtype=torch.bfloat16)),  # mixed dtypes: stock raises as it would
    (torch.randn(0, 8), torch.randn(4, 8)),  # no rows
])
def test_other_products_pass_through_exactly(x, w):
    try:
        expected = ORIGINAL(x, w)
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=str(error)[:20]):
            fast_linear(x, w)
        return
    assert torch.equal(fast_linear(x, w), expected) and linears.decisions() == {}


def test_the_kernels_hold_only_inside_their_blocks_and_never_replace_f_linear(monkeypatch):
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    expected = layer(x)
    assert not linears.active()
    with fast_linears():
        assert linears.active() and torch.nn.functional.linear is ORIGINAL
        torch.testing.assert_close(layer(x), expected)
        with fast_linears():
            assert linears.active()
        assert linears.active()  # the outer block is still open
    assert not linears.active() and torch.nn.functional.linear is ORIGINAL
    with pytest.raises(RuntimeError), fast_linears():
        raise RuntimeError("boom")
    assert not linears.active()
    with fast_linears(on=False):
        assert not linears.active()
    monkeypatch.setenv("OPTTREE_LINEAR", "stock")
    with fast_linears():
        assert not linears.active()


def test_linears_take_the_kernels_only_in_the_thread_of_an_open_block(monkeypatch):
    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    calls = count_calls(monkeypatch, "weight_major")
    layer, x = torch.nn.Linear(16, 24), torch.randn(2, 16)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with fast_linears():
            layer(x)
            a_in.set()
            b_in.wait(HANG_GUARD)
        a_out.set()
        layer(x)  # closed: stock again

    def b():
        a_in.wait(HANG_GUARD)
        with fast_linears():
            b_in.set()
            a_out.wait(HANG_GUARD)
            seen["b after a closed"] = linears.active()
            layer(x)

    threads = [threading.Thread(target=a, name="a"), threading.Thread(target=b, name="b")]
    for t in threads:
        t.start()
    seen["main while both open"] = linears.active()
    layer(x)
    for t in threads:
        t.join(HANG_GUARD)
    assert seen == {"b after a closed": True, "main while both open": False}
    assert [name for name, _ in calls] == ["a", "b"]  # one product each, inside its own block; none from main


def test_tensor_subclasses_with_their_own_torch_function_pass_through(monkeypatch):
    class Tagged(torch.Tensor):
        pass

    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    calls = count_calls(monkeypatch, "weight_major")
    x, w = torch.randn(2, 16), torch.randn(24, 16)
    with fast_linears():
        out = torch.nn.functional.linear(x.as_subclass(Tagged), w)
        assert calls == [] and type(out) is Tagged
        torch.nn.functional.linear(x, w)  # control: a plain tensor is taken
    assert [name for name, _ in calls] == ["MainThread"]


def test_generate_runs_its_forwards_in_a_block_and_leaves_f_linear_alone():
    from models import tiny_model
    from opttree import speculative_generate

    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    seen = []  # whether the kernels were on at each target and draft forward
    for model in (target, draft):
        model.register_forward_pre_hook(lambda *_: seen.append(linears.active()))
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=6, do_sample=False)
    assert torch.equal(out, plain)
    assert seen and all(seen)
    assert not linears.active() and torch.nn.functional.linear is ORIGINAL


def test_plain_linears_in_another_thread_during_a_decode_keep_the_stock_path(monkeypatch):
    """The streamer pattern: generate() on a worker thread, the user's own code on the main thread.
    The main thread's linears run while the worker is inside a verify forward, and must be exactly
    what they were before (the stock path), while the worker's take the block's kernel."""
    from models import tiny_model
    from opttree import speculative_generate

    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")  # every eligible product one kernel: no trials
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    user_layer = torch.nn.Linear(32, 48)
    xs = [torch.randn(rows, 32) for rows in (1, 2, 5)]
    with torch.no_grad():
        before = [user_layer(x) for x in xs]
    inside, done = threading.Event(), threading.Event()

    def hold(*_):  # in the worker's first target forward: let the main thread run, then go on
        if not inside.is_set():
            inside.set()
            done.wait(HANG_GUARD)

    target.register_forward_pre_hook(hold)
    calls = count_calls(monkeypatch, "weight_major")
    result = {}
    worker = threading.Thread(name="decode", target=lambda: result.update(out=target.generate(
        prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4, max_new_tokens=6, do_sample=False)))
    worker.start()
    assert inside.wait(HANG_GUARD)
    with torch.no_grad():
        during = [user_layer(x) for x in xs]
    main_active = linears.active()
    done.set()
    worker.join(HANG_GUARD)
    callers = [name for name, _ in calls]
    assert torch.equal(result["out"], plain)
    assert not main_active and all(torch.equal(a, b) for a, b in zip(before, during))  # bit for bit
    assert "decode" in callers and "MainThread" not in callers  # the worker's linears did take the kernel
    with fast_linears(), torch.no_grad():  # negative control: the main thread's own block is seen
        user_layer(xs[1])
    assert calls[-1][0] == "MainThread"


def test_a_patch_of_f_linear_made_during_a_decode_survives_it(monkeypatch):
    """The block swaps the models' nn.Linear forwards for the call, so F.linear is never replaced."""
    from models import tiny_model
    from opttree import speculative_generate

    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    theirs = []

    def their_linear(*args, **kwargs):  # another library's wrapper, calling the original
        theirs.append(1)
        return ORIGINAL(*args, **kwargs)

    def patch_once(*_):
        if torch.nn.functional.linear is ORIGINAL:
            monkeypatch.setattr(torch.nn.functional, "linear", their_linear)  # undone at the test's end

    hook = target.register_forward_pre_hook(patch_once)
    calls = count_calls(monkeypatch, "weight_major")
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=6, do_sample=False)
    hook.remove()
    assert torch.equal(out, plain)
    assert torch.nn.functional.linear is their_linear  # still theirs after the decode
    assert calls  # the decode's linears took the kernel (the models' layers are swapped, not F.linear)
    before = len(theirs)
    torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert len(theirs) == before + 1 and not linears.active()  # their patch is what F.linear is


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_a_model_no_kernel_can_help_gets_no_block(dtype):
    """float16 on the CPU stands in for a model no kernel here serves (a GPU model); float32 is the
    control. float16 output is checked by the near-tie rule (opttree.tools.ties): the verification
    forward sums in another order than plain decoding; float32 output for exact equality."""
    from models import tiny_model
    from opttree import speculative_generate
    from opttree.tools.ties import check_greedy

    target, draft = tiny_model("llama", seed=0, dtype=dtype), tiny_model("llama", seed=1, dtype=dtype)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=5, do_sample=False)
    seen = []
    hooks = [model.register_forward_pre_hook(lambda *_: seen.append(linears.active())) for model in (target, draft)]
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=5, do_sample=False)
    for hook in hooks:
        hook.remove()
    assert seen and set(seen) == {dtype == torch.float32}
    if dtype == torch.float32:
        assert torch.equal(out, plain)
    else:
        verdict = check_greedy(target, prompt, out[0, prompt.shape[1]:].tolist(), max_new_tokens=5)
        assert verdict.ok, verdict.describe()
    with fast_linears(target):
        assert linears.active() == (dtype == torch.float32)
    with fast_linears():  # no models named: plain decoding asked for it, so it applies
        assert linears.active()


def test_helps_looks_for_a_float32_or_bfloat16_weight_matrix_on_the_cpu():
    assert linears.helps(torch.nn.Linear(4, 4))
    assert linears.helps(torch.nn.Linear(4, 4, dtype=torch.bfloat16))
    assert not linears.helps(torch.nn.Linear(4, 4, dtype=torch.float16))
    assert not linears.helps(torch.nn.Linear(4, 4, device="meta"))  # not on the CPU
    assert not linears.helps(torch.nn.LayerNorm(4))  # no matrix
    assert not linears.helps("prompt_lookup", None)  # no weights of its own
    assert linears.helps(torch.nn.Linear(4, 4, dtype=torch.float16), torch.nn.Linear(4, 4))  # either model


def test_a_gpt2_decode_takes_only_its_lm_head_through_the_kernels(monkeypatch):
    """GPT-2's Conv1D layers call torch.addmm, which the block passes through; its LM head is an nn.Linear."""
    from models import tiny_model
    from opttree import speculative_generate

    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    target = tiny_model("gpt2", seed=0)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=5, do_sample=False)
    calls = count_calls(monkeypatch, "weight_major")
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=target, nodes=4,
                          max_new_tokens=5, do_sample=False)
    assert torch.equal(out, plain)
    assert calls and {shape for _, shape in calls} == {tuple(target.lm_head.weight.shape)}


@pytest.mark.parametrize("fast", ["stock", "weight_major", "onednn", "onednn_pad"])
def test_auto_times_every_candidate_then_keeps_the_fastest(fast, clock, monkeypatch):
    """Every candidate but ``fast`` costs a second of the chooser's clock a product, ``fast`` none."""
    names = linears.candidates(torch.float32, 3)
    if fast not in names:
        pytest.skip(f"{fast} does not run here: no oneDNN in this torch build (torch.backends.mkldnn)")
    calls = {name: 0 for name in names}

    def kernel(name):
        real = REAL_KERNELS[name]

        def timed(*args):
            calls[name] += 1
            if name != fast:
                clock.advance(1.0)
            return real(*args)
        return timed

    for name in names:
        monkeypatch.setitem(linears._KERNEL, name, kernel(name))
    x, w = torch.randn(3, 16), torch.randn(24, 16)
    expected = ORIGINAL(x, w)  # outside the block: inside it, this builtin call too goes through the kernels
    with fast_linears():
        for _ in range(len(names) * TRIALS):
            torch.nn.functional.linear(x, w)
        assert calls == {name: TRIALS for name in names}  # in turns while trying
        threads = torch.get_num_threads()
        assert linears.decisions() == {(torch.float32, threads, 3, 24, 16): fast}
        for _ in range(4):
            torch.testing.assert_close(torch.nn.functional.linear(x, w), expected)
        assert calls == {name: TRIALS + (4 if name == fast else 0) for name in names}  # then only the fastest
        torch.nn.functional.linear(torch.randn(2, 16), w)  # another row count: its own trials
        assert (torch.float32, threads, 2, 24, 16) not in linears.decisions()


def test_a_kernel_that_fails_here_is_dropped_for_its_shape_and_the_others_still_compete(clock, monkeypatch):
    """A kernel offered but failing at its first product (a CPU feature the capability check missed)
    is dropped for that shape; the remaining candidates are still timed and the fastest kept."""
    broken_calls = []

    def broken(*args):
        broken_calls.append(1)
        raise RuntimeError("no such kernel on this CPU")

    def slow_stock(*args):
        clock.advance(1.0)  # a second of the chooser's clock: stock must not win by default
        return REAL_KERNELS["stock"](*args)

    monkeypatch.setattr(linears, "candidates", lambda dtype, rows=4: ("stock", "weight_major", "onednn"))
    monkeypatch.setitem(linears._KERNEL, "stock", slow_stock)
    monkeypatch.setitem(linears._KERNEL, "onednn", broken)
    x, w = torch.randn(3, 16), torch.randn(24, 16)
    outs = [fast_linear(x, w) for _ in range(2 * TRIALS + 3)]
    assert all(torch.allclose(o, ORIGINAL(x, w), atol=1e-5) for o in outs)  # the failed product fell back
    key = (torch.float32, torch.get_num_threads(), 3, 24, 16)
    assert len(broken_calls) == 1  # tried once, never again for this shape
    assert linears.dropped() == {key: {"onednn"}}
    assert linears.decisions() == {key: "weight_major"}  # not stock: the others still competed
    for _ in range(2 * TRIALS + 3):
        fast_linear(torch.randn(2, 16), w)  # another shape: the kernel is tried there too, once
    assert len(broken_calls) == 2 and linears.dropped()[(*key[:2], 2, 24, 16)] == {"onednn"}


def test_a_cpu_without_onednns_bfloat16_gets_no_such_candidate_and_decodes_as_plain(monkeypatch):
    """An AVX2-only CPU, faked: oneDNN runs float32 but not bfloat16 there. The bfloat16 candidates
    shrink to stock, no oneDNN kernel is called in bfloat16, and a bfloat16 decode through the
    kernels still equals plain (near-ties of plain's own scores aside, opttree.tools.ties)."""
    from models import tiny_model
    from opttree import speculative_generate
    from opttree.kernels.cpu import CpuSupport
    from opttree.tools.ties import check_greedy

    here = linears.candidates(torch.bfloat16, 1)
    monkeypatch.setattr(linears, "cpu_support", lambda: CpuSupport(onednn=True, onednn_bf16=False, aten_isa="AVX2"))
    assert linears.candidates(torch.bfloat16, 1) == ("stock",)
    assert linears.candidates(torch.bfloat16, 8) == ("stock",)
    assert linears.candidates(torch.float32, 1) == ("stock", "weight_major", "onednn", "onednn_pad")
    assert set(linears.candidates(torch.bfloat16, 1)) <= set(here)  # a subset of what this CPU offers
    calls = count_calls(monkeypatch, "onednn") + count_calls(monkeypatch, "onednn_pad")
    target, draft = (tiny_model("llama", seed=s, dtype=torch.bfloat16) for s in (0, 1))
    prompt = torch.tensor([[1, 5, 9, 2]])
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=8, do_sample=False)
    verdict = check_greedy(target, prompt, out[0, prompt.shape[1]:].tolist(), max_new_tokens=8)
    assert verdict.ok, verdict.describe()
    assert calls == []  # no oneDNN product in bfloat16
    assert linears.decisions() and set(linears.decisions().values()) == {"stock"}
    monkeypatch.setattr(linears, "cpu_support", lambda: CpuSupport(onednn=True, onednn_bf16=True, aten_isa="AVX512"))
    assert "onednn" in linears.candidates(torch.bfloat16, 1)  # control: the fake decides the candidates


def test_the_packed_weight_is_made_once_and_again_after_an_in_place_change():
    if not linears.cpu_support().onednn:
        pytest.skip("no oneDNN in this torch build (torch.backends.mkldnn)")
    w, x = torch.randn(24, 16), torch.randn(3, 16)
    first = linears.packed_weight(w)
    assert linears.packed_weight(w) is first  # kept
    with torch.no_grad():
        w.mul_(2.0)  # an optimizer step, say
    again = linears.packed_weight(w)
    assert again is not first
    torch.testing.assert_close(fast_linear(x, w, auto=False, kernel="onednn"), ORIGINAL(x, w), rtol=1e-5, atol=1e-5)


def test_auto_choices_are_made_again_at_another_thread_count():
    x, w = torch.randn(3, 16), torch.randn(24, 16)
    threads = torch.get_num_threads()
    trials = len(linears.candidates(torch.float32, 3)) * TRIALS
    try:
        with fast_linears():
            for _ in range(trials):
                torch.nn.functional.linear(x, w)
            assert set(linears.decisions()) == {(torch.float32, threads, 3, 24, 16)}
            torch.set_num_threads(threads + 1)
            for _ in range(trials - 1):
                torch.nn.functional.linear(x, w)
            assert set(linears.decisions()) == {(torch.float32, threads, 3, 24, 16)}  # still trying at threads + 1
            torch.nn.functional.linear(x, w)
            assert set(linears.decisions()) == {(torch.float32, threads, 3, 24, 16),
                                                (torch.float32, threads + 1, 3, 24, 16)}
    finally:
        torch.set_num_threads(threads)


def test_concurrent_auto_trials_record_every_run_once():
    """Decodes in several threads share the choices: their trial bookkeeping is under a lock."""
    w = torch.randn(24, 16)
    barrier = threading.Barrier(4)
    errors = []

    def work():
        try:
            barrier.wait(HANG_GUARD)
            with fast_linears():
                for _ in range(200):
                    for r in (1, 2, 3):
                        torch.nn.functional.linear(torch.randn(r, 16), w)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    n = torch.get_num_threads()
    assert not errors and set(linears.decisions()) == {(torch.float32, n, r, 24, 16) for r in (1, 2, 3)}
    assert linears._choice.rounds == {}  # no trial left in progress


def test_a_fixed_kernel_skips_the_trials(monkeypatch):
    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    calls = count_calls(monkeypatch, "weight_major")
    with fast_linears():
        for _ in range(3):
            torch.nn.functional.linear(torch.randn(2, 16), torch.randn(24, 16))
    assert linears.decisions() == {} and linears._choice.rounds == {} and len(calls) == 3


@pytest.mark.parametrize("linear, mode", [(None, "auto"), ("onednn", "onednn"), (" Stock ", "stock"), ("auto", "auto")])
def test_the_environment_names_the_kernel(linear, mode, monkeypatch):
    if linear is not None:
        monkeypatch.setenv("OPTTREE_LINEAR", linear)
    assert linears.mode() == mode


@pytest.mark.parametrize("value", ["fastest", "on"])
def test_a_bad_setting_says_which_values_work(value, monkeypatch):
    monkeypatch.setenv("OPTTREE_LINEAR", value)
    with pytest.raises(ValueError, match="auto or one of stock, weight_major, onednn, onednn_pad"), fast_linears():
        pass
    assert not linears.active()


def test_the_kernel_benchmark_times_every_kernel_and_restores_the_setting(tmp_path, capsys, monkeypatch):
    import importlib.util
    import os
    from pathlib import Path

    from models import tiny_model

    tiny_model("llama", seed=0).save_pretrained(tmp_path)
    path = Path(__file__).parent.parent / "benchmarks" / "kernel.py"
    spec = importlib.util.spec_from_file_location("kernel_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    common = ["--target", str(tmp_path), "--sizes", "0", "3", "--prefix", "8", "--repeats", "1",
              "--threads", str(torch.get_num_threads())]
    bench.main(common)
    out = capsys.readouterr().out
    assert "| rows | 1 | 4 |" in out
    assert all(f"| `{mode}` |" in out for mode in ("stock", "weight_major", "onednn", "onednn_pad", "auto"))
    assert "auto kept: " in out
    bench.main(common + ["--products"])
    out = capsys.readouterr().out
    assert "| out × in (count) | rows |" in out and "mkl_packed" in out
    assert os.environ["OPTTREE_LINEAR"] == "weight_major" and torch.nn.functional.linear is ORIGINAL


def test_the_models_linears_are_swapped_only_during_the_block_and_restored():
    from models import tiny_model

    target = tiny_model("llama", seed=0)
    layers = linears.swappable(target)
    assert layers and all("forward" not in m.__dict__ for m in layers)
    with fast_linears(target, on=True):
        assert all("forward" in m.__dict__ for m in layers)
        with fast_linears(target):  # nested: nothing more
            pass
        assert all("forward" in m.__dict__ for m in layers)
    assert all("forward" not in m.__dict__ for m in layers)  # the class's forward again


@pytest.mark.parametrize("wrap", ["head", "mixed"])
def test_a_feature_heads_layers_and_output_product_take_the_kernels_alone_or_mixed(wrap, monkeypatch):
    """The head's output over its kept tokens is a functional product, no nn.Linear to swap: it goes
    through linears.linear. Its layers are swapped through Drafter.modules(), also when the head
    sits inside a MixedDrafter (which is no nn.Module: passing the user's object missed them)."""
    from models import tiny_model
    from opttree import speculative_generate
    from opttree.distill.train.head import new_head
    from opttree.drafters import MixedDrafter

    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    target = tiny_model("llama", seed=0)
    head, _ = new_head(target)
    taken = set()  # data_ptr of each weight that took the kernel
    real = REAL_KERNELS["weight_major"]
    monkeypatch.setitem(linears._KERNEL, "weight_major", lambda flat, w, b: taken.add(w.data_ptr()) or real(flat, w, b))
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    out = target.generate(prompt, custom_generate=speculative_generate, max_new_tokens=6, do_sample=False, nodes=4,
                          draft_model=head if wrap == "head" else MixedDrafter(head))
    assert torch.equal(out, plain)
    assert head.out_weight.data_ptr() in taken  # the output product
    assert head.fc.weight.data_ptr() in taken  # a swapped layer of the head
    assert not linears.active() and all("forward" not in m.__dict__ for m in linears.swappable(head))


def test_the_functional_product_is_the_stock_one_outside_a_block_and_the_kernels_inside(monkeypatch):
    calls = count_calls(monkeypatch, "weight_major")
    monkeypatch.setenv("OPTTREE_LINEAR", "weight_major")
    x, w, b = torch.randn(3, 16), torch.randn(40, 16), torch.randn(40)
    assert torch.equal(linears.linear(x, w, b), ORIGINAL(x, w, b)) and not calls
    stock = ORIGINAL(x, w, b)
    with fast_linears(on=True):
        assert torch.allclose(linears.linear(x, w, b), stock, atol=1e-5) and len(calls) == 1


def test_a_weight_bigger_than_any_cache_is_decided_at_its_first_product(monkeypatch):
    """An LM head is met once a forward: its trials all run at its first product (it comes from
    memory each time anyway), not one product per forward. A smaller weight keeps one trial per
    product (control)."""
    x, big, small = torch.randn(3, 16), torch.randn(64, 16), torch.randn(8, 16)
    monkeypatch.setattr(linears, "IN_PLACE_BYTES", big.numel() * big.element_size())
    names = linears.candidates(torch.float32, 3)
    calls = {name: count_calls(monkeypatch, name) for name in names}
    torch.testing.assert_close(fast_linear(x, big), ORIGINAL(x, big), rtol=1e-5, atol=1e-5)
    threads = torch.get_num_threads()
    assert (torch.float32, threads, 3, 64, 16) in linears.decisions()
    assert all(len(c) == TRIALS for c in calls.values())  # every candidate timed TRIALS times, at once
    fast_linear(x, small)
    assert (torch.float32, threads, 3, 8, 16) not in linears.decisions()  # one trial, not decided yet
    assert sum(len(c) for c in calls.values()) == TRIALS * len(names) + 1
