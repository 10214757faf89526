"""The weight-major few-row linear gives F.linear's results, takes its path only where it is meant
to (in "auto" mode: where it was timed faster), and its patch is undone when the last open block
closes (nested, failing or concurrent)."""

import threading
import time

import pytest
import torch

from opttree import fast_linear
from opttree.fast_linear import MAX_ROWS, TRIALS, weight_major, weight_major_linear

ORIGINAL = torch.nn.functional.linear


@pytest.fixture(autouse=True)
def default_kernel(monkeypatch):
    monkeypatch.delenv("OPTTREE_WEIGHT_MAJOR", raising=False)  # the default, whatever the caller's shell says
    monkeypatch.setattr(fast_linear, "_faster", {})  # no choices carried in from other tests
    monkeypatch.setattr(fast_linear, "_trials", {})
    monkeypatch.setattr(fast_linear, "_timing", True)


@pytest.mark.parametrize("shape", [(1, 16), (1, 1, 16), (2, 16), (1, 3, 16), (5, 16), (2, 4, 16), (9, 16)])
@pytest.mark.parametrize("out_features", [24, 9000])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("timing", [False, True])  # "on" (always weight-major) / "auto" trials
def test_weight_major_linear_equals_f_linear(shape, out_features, bias, timing, monkeypatch):
    monkeypatch.setattr(fast_linear, "_timing", timing)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(out_features, 16, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    for _ in range(2 * TRIALS + 1 if timing else 1):  # both trial paths and the chosen one
        out = weight_major_linear(x, w, b)
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


def test_the_patch_holds_only_inside_its_blocks(monkeypatch):
    with weight_major():
        assert torch.nn.functional.linear is weight_major_linear
        layer = torch.nn.Linear(8, 4)
        x = torch.randn(3, 8)
        torch.testing.assert_close(layer(x), ORIGINAL(x, layer.weight, layer.bias))
        with weight_major():
            pass
        assert torch.nn.functional.linear is weight_major_linear  # the outer block is still open
    assert torch.nn.functional.linear is ORIGINAL
    with pytest.raises(RuntimeError), weight_major():
        raise RuntimeError("boom")
    assert torch.nn.functional.linear is ORIGINAL
    with weight_major(on=False):
        assert torch.nn.functional.linear is ORIGINAL
    monkeypatch.setenv("OPTTREE_WEIGHT_MAJOR", "off")
    with weight_major():
        assert torch.nn.functional.linear is ORIGINAL


def test_blocks_in_two_threads_that_close_out_of_order_restore_the_original():
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with weight_major():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with weight_major():
            b_in.set()
            a_out.wait(5)
            seen["after a closed"] = torch.nn.functional.linear

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after a closed"] is weight_major_linear
    assert torch.nn.functional.linear is ORIGINAL


def test_generate_runs_its_forwards_weight_major_and_restores_after():
    from models import tiny_model
    from opttree import speculative_generate

    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    prompt = torch.tensor([[1, 5, 9, 2]])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False)
    seen = []  # the linear function in force at each target and draft forward
    for model in (target, draft):
        model.register_forward_pre_hook(lambda *_: seen.append(torch.nn.functional.linear))
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=draft, nodes=4,
                          max_new_tokens=6, do_sample=False)
    assert torch.equal(out, plain)
    assert seen and all(f is weight_major_linear for f in seen)
    assert torch.nn.functional.linear is ORIGINAL


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
    with weight_major():
        for _ in range(2 * TRIALS):
            torch.nn.functional.linear(x, w)
        assert calls == {"stock": TRIALS, "weight-major": TRIALS}  # alternated while trying
        assert fast_linear.decisions() == {(3, 24, 16): slow == "stock"}
        for _ in range(4):
            torch.testing.assert_close(torch.nn.functional.linear(x, w), ORIGINAL(x, w))
        other = "weight-major" if slow == "stock" else "stock"
        assert calls == {slow: TRIALS, other: TRIALS + 4}  # then only the faster one
        torch.nn.functional.linear(torch.randn(2, 16), w)  # another row count: its own trials
        assert (2, 24, 16) not in fast_linear.decisions()


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
    assert torch.nn.functional.linear is ORIGINAL


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
