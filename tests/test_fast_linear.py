"""The weight-major few-row linear gives F.linear's results, takes its path only where it is meant
to (in "auto" mode: where it was timed faster, per thread count), and only for the linears of the
thread that opened a block: torch.nn.functional.linear itself is never replaced, other threads keep
the stock path, someone else's patch of it survives, and models it cannot help get no mode."""

import threading
import time

import pytest
import torch

from opttree.hf import fast_linear
from opttree.hf.fast_linear import MAX_ROWS, TRIALS, weight_major, weight_major_linear

ORIGINAL = torch.nn.functional.linear


@pytest.fixture(autouse=True)
def default_kernel(monkeypatch):
    monkeypatch.delenv("OPTTREE_WEIGHT_MAJOR", raising=False)  # the default, whatever the caller's shell says
    monkeypatch.setattr(fast_linear, "_faster", {})  # no choices carried in from other tests
    monkeypatch.setattr(fast_linear, "_trials", {})


@pytest.mark.parametrize("shape", [(1, 16), (1, 1, 16), (2, 16), (1, 3, 16), (5, 16), (2, 4, 16), (9, 16)])
@pytest.mark.parametrize("out_features", [24, 9000])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("timing", [False, True])  # "on" (always weight-major) / "auto" trials
def test_weight_major_linear_equals_f_linear(shape, out_features, bias, timing):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(out_features, 16, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    for _ in range(2 * TRIALS + 1 if timing else 1):  # both trial paths and the chosen one
        out = weight_major_linear(x, w, b, auto=timing)
        assert out.shape == (*shape[:-1], out_features) and out.is_contiguous()
        torch.testing.assert_close(out, ORIGINAL(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x, w", [
    (torch.randn(MAX_ROWS + 1, 8), torch.randn(4, 8)),  # too many rows
    (torch.randn(3, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)),  # not float32
    (torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)),
    (torch.randn(0, 8), torch.randn(4, 8)),  # no rows
])
def test_other_products_pass_through_exactly(x, w):
    assert torch.equal(weight_major_linear(x, w), ORIGINAL(x, w))


def test_the_kernel_holds_only_inside_its_blocks_and_never_replaces_f_linear(monkeypatch):
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    expected = layer(x)
    assert not fast_linear.active()
    with weight_major():
        assert fast_linear.active() and torch.nn.functional.linear is ORIGINAL
        torch.testing.assert_close(layer(x), expected)
        with weight_major():
            assert fast_linear.active()
        assert fast_linear.active()  # the outer block is still open
    assert not fast_linear.active() and torch.nn.functional.linear is ORIGINAL
    with pytest.raises(RuntimeError), weight_major():
        raise RuntimeError("boom")
    assert not fast_linear.active()
    with weight_major(on=False):
        assert not fast_linear.active()
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "off")
    with weight_major():
        assert not fast_linear.active()


def test_linears_go_weight_major_only_in_the_thread_of_an_open_block(monkeypatch):
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    callers = count_weight_major_calls(monkeypatch)
    layer, x = torch.nn.Linear(16, 24), torch.randn(2, 16)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with weight_major():
            layer(x)
            a_in.set()
            b_in.wait(5)
        a_out.set()
        layer(x)  # closed: stock again

    def b():
        a_in.wait(5)
        with weight_major():
            b_in.set()
            a_out.wait(5)
            seen["b after a closed"] = fast_linear.active()
            layer(x)

    threads = [threading.Thread(target=a, name="a"), threading.Thread(target=b, name="b")]
    for t in threads:
        t.start()
    seen["main while both open"] = fast_linear.active()
    layer(x)
    for t in threads:
        t.join(10)
    assert seen == {"b after a closed": True, "main while both open": False}
    assert callers == ["a", "b"]  # one product each, inside its own block; none from main


def test_tensor_subclasses_with_their_own_torch_function_pass_through(monkeypatch):
    class Tagged(torch.Tensor):
        pass

    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    callers = count_weight_major_calls(monkeypatch)
    x, w = torch.randn(2, 16), torch.randn(24, 16)
    with weight_major():
        out = torch.nn.functional.linear(x.as_subclass(Tagged), w)
        assert callers == [] and type(out) is Tagged
        torch.nn.functional.linear(x, w)  # control: a plain tensor is taken
    assert callers == ["MainThread"]


def count_weight_major_calls(monkeypatch) -> list[str]:
    """The names of the threads that take the weight-major path from now on, one per product."""
    callers = []
    real = fast_linear._weight_major_mm

    def recorded(*args):
        callers.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(fast_linear, "_weight_major_mm", recorded)
    return callers


def test_generate_runs_its_forwards_weight_major_and_leaves_f_linear_alone():
    from models import tiny_model
    from opttree import speculative_generate

    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    seen = []  # whether the kernel was on at each target and draft forward
    for model in (target, draft):
        model.register_forward_pre_hook(lambda *_: seen.append(fast_linear.active()))
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=6, do_sample=False)
    assert torch.equal(out, plain)
    assert seen and all(seen)
    assert not fast_linear.active() and torch.nn.functional.linear is ORIGINAL


def test_plain_linears_in_another_thread_during_a_decode_keep_the_stock_path(monkeypatch):
    """The streamer pattern: generate() on a worker thread, the user's own code on the main thread.
    The main thread's linears run while the worker is inside a verify forward, and must be exactly
    what they were before (the stock path), while the worker's take the weight-major one."""
    from models import tiny_model
    from opttree import speculative_generate

    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")  # every eligible product weight-major: no trials
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
            done.wait(10)

    target.register_forward_pre_hook(hold)
    callers = count_weight_major_calls(monkeypatch)
    result = {}
    worker = threading.Thread(name="decode", target=lambda: result.update(out=target.generate(
        prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4, max_new_tokens=6, do_sample=False)))
    worker.start()
    assert inside.wait(10)
    with torch.no_grad():
        during = [user_layer(x) for x in xs]
    main_active = fast_linear.active()
    done.set()
    worker.join(30)
    assert torch.equal(result["out"], plain)
    assert not main_active and all(torch.equal(a, b) for a, b in zip(before, during))  # bit for bit
    assert "decode" in callers and "MainThread" not in callers  # the worker's linears did go weight-major
    with weight_major(), torch.no_grad():  # negative control: the main thread's own block is seen
        user_layer(xs[1])
    assert callers[-1] == "MainThread"


def test_a_patch_of_f_linear_made_during_a_decode_survives_it(monkeypatch):
    """The kernel swaps the models' nn.Linear forwards for the call, so F.linear is never replaced."""
    from models import tiny_model
    from opttree import speculative_generate

    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
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
    callers = count_weight_major_calls(monkeypatch)
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=6, do_sample=False)
    hook.remove()
    assert torch.equal(out, plain)
    assert torch.nn.functional.linear is their_linear  # still theirs after the decode
    assert callers  # the decode's linears took the kernel (the models' layers are swapped, not F.linear)
    before = len(theirs)
    torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert len(theirs) == before + 1 and not fast_linear.active()  # their patch is what F.linear is


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_model_the_kernel_cannot_help_gets_no_mode(dtype):
    """bf16 on the CPU stands in for a GPU model (no float32 CPU weight); float32 is the control.

    In bf16 this random model's plain logits at new token 1 hold an exact tie (tokens 42 and 65 both
    0.310546875); the verification forward's rounding may put either first, depending on the CPU's
    kernels (AVX2: 65, one bf16 unit above 42; AVX-512: 42), so bf16 output is checked by the near-tie
    rule (opttree.tools.ties), float32 output for exact equality."""
    from models import tiny_model
    from opttree import speculative_generate
    from opttree.tools.ties import check_greedy

    target, draft = tiny_model("llama", seed=0, dtype=dtype), tiny_model("llama", seed=1, dtype=dtype)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=5, do_sample=False)
    seen = []
    hooks = [model.register_forward_pre_hook(lambda *_: seen.append(fast_linear.active())) for model in (target, draft)]
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
    with weight_major(target):
        assert fast_linear.active() == (dtype == torch.float32)
    with weight_major():  # no models named: plain decoding asked for it, so it applies
        assert fast_linear.active()


def test_helps_looks_for_a_float32_weight_matrix_on_the_cpu():
    assert fast_linear.helps(torch.nn.Linear(4, 4))
    assert not fast_linear.helps(torch.nn.Linear(4, 4, dtype=torch.bfloat16))
    assert not fast_linear.helps(torch.nn.Linear(4, 4, device="meta"))  # not on the CPU
    assert not fast_linear.helps(torch.nn.LayerNorm(4))  # no matrix
    assert not fast_linear.helps("prompt_lookup", None)  # no weights of its own
    assert fast_linear.helps(torch.nn.Linear(4, 4, dtype=torch.bfloat16), torch.nn.Linear(4, 4))  # either model


def test_a_gpt2_decode_takes_only_its_lm_head_weight_major(monkeypatch):
    """GPT-2's Conv1D layers call torch.addmm, which the mode passes through; its LM head is an nn.Linear."""
    from models import tiny_model
    from opttree import speculative_generate

    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    target = tiny_model("gpt2", seed=0)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=5, do_sample=False)
    shapes = []
    real = fast_linear._weight_major_mm
    monkeypatch.setattr(fast_linear, "_weight_major_mm", lambda flat, w: shapes.append(tuple(w.shape)) or real(flat, w))
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=target, nodes=4,
                          max_new_tokens=5, do_sample=False)
    assert torch.equal(out, plain)
    assert shapes and set(shapes) == {tuple(target.lm_head.weight.shape)}


@pytest.mark.parametrize("slow", ["stock", "weight-major"])
def test_auto_mode_times_both_paths_then_keeps_the_faster(slow, monkeypatch):
    calls = {"stock": 0, "weight-major": 0}

    def path(name, fn):
        def timed(*args):
            calls[name] += 1
            if name == slow:
                time.sleep(0.003)  # far above either product's own time
            return fn(*args)
        return timed

    monkeypatch.setattr(fast_linear, "_linear", path("stock", fast_linear._linear))
    monkeypatch.setattr(fast_linear, "_weight_major_mm", path("weight-major", fast_linear._weight_major_mm))
    x, w = torch.randn(3, 16), torch.randn(24, 16)
    expected = ORIGINAL(x, w)  # outside the block: inside it, this builtin call too goes through the kernel
    with weight_major():
        for _ in range(2 * TRIALS):
            torch.nn.functional.linear(x, w)
        assert calls == {"stock": TRIALS, "weight-major": TRIALS}  # alternated while trying
        threads = torch.get_num_threads()
        assert fast_linear.decisions() == {(threads, 3, 24, 16): slow == "stock"}
        for _ in range(4):
            torch.testing.assert_close(torch.nn.functional.linear(x, w), expected)
        other = "weight-major" if slow == "stock" else "stock"
        assert calls == {slow: TRIALS, other: TRIALS + 4}  # then only the faster one
        torch.nn.functional.linear(torch.randn(2, 16), w)  # another row count: its own trials
        assert (threads, 2, 24, 16) not in fast_linear.decisions()


def test_auto_choices_are_made_again_at_another_thread_count(monkeypatch):
    x, w = torch.randn(3, 16), torch.randn(24, 16)
    threads = torch.get_num_threads()
    try:
        with weight_major():
            for _ in range(2 * TRIALS):
                torch.nn.functional.linear(x, w)
            assert set(fast_linear.decisions()) == {(threads, 3, 24, 16)}
            torch.set_num_threads(threads + 1)
            for _ in range(2 * TRIALS - 1):
                torch.nn.functional.linear(x, w)
            assert set(fast_linear.decisions()) == {(threads, 3, 24, 16)}  # still trying at threads + 1
            torch.nn.functional.linear(x, w)
            assert set(fast_linear.decisions()) == {(threads, 3, 24, 16), (threads + 1, 3, 24, 16)}
    finally:
        torch.set_num_threads(threads)


def test_concurrent_auto_trials_record_every_run_once():
    """Decodes in several threads share the choices: their trial bookkeeping is under a lock."""
    w = torch.randn(24, 16)
    barrier = threading.Barrier(4)
    errors = []

    def work(rows):
        try:
            barrier.wait(5)
            with weight_major():
                for _ in range(200):
                    for r in (1, 2, 3):
                        torch.nn.functional.linear(torch.randn(r, 16), w)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    n = torch.get_num_threads()
    assert not errors and set(fast_linear.decisions()) == {(n, r, 24, 16) for r in (1, 2, 3)}
    assert fast_linear._trials == {}


def test_on_mode_skips_the_trials(monkeypatch):
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    with weight_major():
        for _ in range(3):
            torch.nn.functional.linear(torch.randn(2, 16), torch.randn(24, 16))
    assert fast_linear.decisions() == {} and fast_linear._trials == {}


@pytest.mark.parametrize("value, mode", [("auto", "auto"), ("ON", "on"), ("1", "on"), ("off", "off"),
                                         ("0", "off"), ("false", "off"), (" Auto ", "auto")])
def test_the_environment_variable_names_a_mode(value, mode, monkeypatch):
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", value)
    assert fast_linear.mode() == mode


def test_a_bad_mode_says_which_values_work(monkeypatch):
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "fast")
    with pytest.raises(ValueError, match="auto, on or off"), weight_major():
        pass
    assert not fast_linear.active()


def test_the_kernel_benchmark_times_all_three_modes_and_restores_the_setting(tmp_path, capsys, monkeypatch):
    import importlib.util
    import os
    from pathlib import Path

    from models import tiny_model

    tiny_model("llama", seed=0).save_pretrained(tmp_path)
    path = Path(__file__).parent.parent / "benchmarks" / "kernel.py"
    spec = importlib.util.spec_from_file_location("kernel_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    bench.main(["--target", str(tmp_path), "--sizes", "0", "2", "--prefix", "8", "--repeats", "1",
                "--threads", str(torch.get_num_threads())])
    out = capsys.readouterr().out
    assert "| tokens | 1 | 3 |" in out
    assert all(f"| `{mode}` |" in out for mode in ("off", "on", "auto"))
    assert "auto: weight-major kept for" in out
    assert os.environ["OPTTREE_WEIGHT_MAJOR"] == "on" and torch.nn.functional.linear is ORIGINAL


def test_the_models_linears_are_swapped_only_during_the_block_and_restored():
    from models import tiny_model

    target = tiny_model("llama", seed=0)
    layers = fast_linear.swappable(target)
    assert layers and all("forward" not in m.__dict__ for m in layers)
    with fast_linear.weight_major(target, on=True):
        assert all("forward" in m.__dict__ for m in layers)
        with fast_linear.weight_major(target):  # nested: nothing more
            pass
        assert all("forward" in m.__dict__ for m in layers)
    assert all("forward" not in m.__dict__ for m in layers)  # the class's forward again


@pytest.mark.parametrize("wrap", ["head", "mixed"])
def test_a_feature_heads_layers_and_output_product_take_the_kernel_alone_or_mixed(wrap, monkeypatch):
    """The head's output over its kept tokens is a functional product, no nn.Linear to swap: it goes
    through fast_linear.linear. Its layers are swapped through Drafter.modules(), also when the head
    sits inside a MixedDrafter (which is no nn.Module: passing the user's object missed them)."""
    from models import tiny_model
    from opttree import speculative_generate
    from opttree.distill.head import new_head
    from opttree.drafters import MixedDrafter

    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    target = tiny_model("llama", seed=0)
    head, _ = new_head(target)
    taken = set()  # data_ptr of each weight that went weight-major
    real = fast_linear._weight_major_mm
    monkeypatch.setattr(fast_linear, "_weight_major_mm", lambda flat, w: taken.add(w.data_ptr()) or real(flat, w))
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    out = target.generate(prompt, custom_generate=speculative_generate, max_new_tokens=6, do_sample=False, nodes=4,
                          draft_model=head if wrap == "head" else MixedDrafter(head))
    assert torch.equal(out, plain)
    assert head.out_weight.data_ptr() in taken  # the output product
    assert head.fc.weight.data_ptr() in taken  # a swapped layer of the head
    assert not fast_linear.active() and all("forward" not in m.__dict__ for m in fast_linear.swappable(head))


def test_the_functional_product_is_the_stock_one_outside_a_block_and_weight_major_inside(monkeypatch):
    calls = []
    real = fast_linear._weight_major_mm
    monkeypatch.setattr(fast_linear, "_weight_major_mm", lambda flat, w: calls.append(1) or real(flat, w))
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "on")
    x, w, b = torch.randn(3, 16), torch.randn(40, 16), torch.randn(40)
    assert torch.equal(fast_linear.linear(x, w, b), ORIGINAL(x, w, b)) and not calls
    stock = ORIGINAL(x, w, b)
    with fast_linear.weight_major(on=True):
        assert torch.allclose(fast_linear.linear(x, w, b), stock, atol=1e-5) and calls == [1]
