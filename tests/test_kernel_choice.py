"""How ``OPTTREE_LINEAR=auto`` chooses a kernel (opttree.kernels.choice, through fast_linear): stock is
always a candidate, every row count has its own choice, and the choice made in the first trials is
checked again after warm-up. Pinned by decisions and call counts under a fake clock, given to the
chooser as its declared ``clock``: each fake kernel advances it by the cost the test gives it, so no
result depends on this machine's speed or load."""

import pytest
import torch

from clocks import FakeClock
from opttree.kernels import linears
from opttree.kernels.choice import Chooser
from opttree.kernels.cpu import CpuSupport
from opttree.kernels.linears import MAX_ROWS, TRIALS, fast_linear

REAL_KERNELS = dict(linears._KERNEL)
REAL_STOCK = linears._stock
PRODUCTS = 600  # products a test runs: its keys' first trials, warm-up and re-check fit well within


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.delenv("OPTTREE_LINEAR", raising=False)
    monkeypatch.setattr(linears, "_KERNEL", dict(REAL_KERNELS))
    linears.forget_decisions()
    yield
    linears.forget_decisions()


def fake_costs(monkeypatch, cost) -> list[tuple[str, int, int]]:
    """A fresh chooser on a fake clock; every kernel (stock's path included) advances that clock by
    ``cost(kernel, rows, product index)`` seconds and is recorded as (kernel, rows, id of the weight)."""
    clock, calls = FakeClock(), []
    monkeypatch.setattr(linears, "_choice", Chooser(clock=clock))

    def faked(name, real):
        def kernel(flat, weight, bias=None):
            rows = flat.numel() // flat.shape[-1]
            clock.advance(cost(name, rows, len(calls)))
            calls.append((name, rows, id(weight)))
            return real(flat, weight, bias)
        return kernel

    monkeypatch.setattr(linears, "_stock", faked("stock", REAL_STOCK))  # stock's path, whichever way it is reached
    for name in linears.KERNELS[1:]:
        monkeypatch.setitem(linears._KERNEL, name, faked(name, REAL_KERNELS[name]))
    return calls


def key(rows: int, weight: torch.Tensor) -> tuple:
    return (torch.float32, torch.get_num_threads(), rows, *weight.shape)


def needs_onednn():
    if "onednn" not in linears.candidates(torch.float32, 1):
        pytest.skip("no oneDNN in this torch build: no candidate but stock and weight_major to choose from")


@pytest.mark.parametrize("support", [None, CpuSupport(onednn=False, onednn_bf16=False, aten_isa="DEFAULT"),
                                     CpuSupport(onednn=True, onednn_bf16=False, aten_isa="AVX2"),
                                     CpuSupport(onednn=True, onednn_bf16=True, aten_isa="AVX512")],
                         ids=["this-cpu", "no-onednn", "avx2", "avx512"])
def test_stock_is_a_candidate_at_every_dtype_and_row_count(support, monkeypatch):
    if support is not None:
        monkeypatch.setattr(linears, "cpu_support", lambda: support)
    for dtype in linears.DTYPES:
        for rows in range(1, MAX_ROWS + 1):
            names = linears.candidates(dtype, rows)
            assert names[0] == "stock", (dtype, rows, names)


def test_one_row_keeps_stock_where_another_kernel_wins_at_four_rows(monkeypatch):
    """Verification of 4 rows and plain decoding's 1 row take turns on the same layers: stock is the
    fastest at 1 row, oneDNN at 4; each row count must get its own kernel, also after the re-check."""
    needs_onednn()
    at_one = {"stock": 1.0, "weight_major": 2.0, "onednn": 2.0, "onednn_pad": 2.0}
    at_four = {"stock": 10.0, "weight_major": 10.0, "onednn": 1.0}
    calls = fake_costs(monkeypatch, lambda name, rows, i: (at_one if rows == 1 else at_four)[name])
    weights = [torch.randn(24, 16) for _ in range(3)]  # three layers of one shape
    for i in range(PRODUCTS // 2):
        w = weights[i % 3]
        fast_linear(torch.randn(4, 16), w)
        fast_linear(torch.randn(1, 16), w)
    assert linears.decisions() == {key(1, weights[0]): "stock", key(4, weights[0]): "onednn"}
    last = calls[-60:]
    assert {name for name, rows, _ in last if rows == 1} == {"stock"}
    assert {name for name, rows, _ in last if rows == 4} == {"onednn"}


def test_a_kernel_fast_in_the_first_trials_but_slow_after_warm_up_is_replaced(monkeypatch):
    """oneDNN wins the first trials (its products cheap there) and is slow from then on: the re-check
    after warm-up replaces it with stock, which then takes every product."""
    needs_onednn()
    first = TRIALS * len(linears.candidates(torch.float32, 3))  # the first trials' products

    def cost(name, rows, i):
        if name == "onednn":
            return 0.5 if i < first else 3.0
        return 1.0 if name == "stock" else 2.0

    calls = fake_costs(monkeypatch, cost)
    weights = [torch.randn(24, 16) for _ in range(4)]
    for i in range(first):
        fast_linear(torch.randn(3, 16), weights[i % 4])
    assert linears.decisions() == {key(3, weights[0]): "onednn"}  # what the first trials found
    for i in range(PRODUCTS):
        fast_linear(torch.randn(3, 16), weights[i % 4])
    assert linears.decisions() == {key(3, weights[0]): "stock"}
    assert {name for name, _, _ in calls[-40:]} == {"stock"}


def test_the_re_check_comes_after_warm_up_and_its_figures_alone_decide(monkeypatch):
    """Counts of the re-check: it starts only once the provisional kernel has met every weight of the
    key and RECHECK_AFTER products have passed, times each candidate TRIALS times more, and settles."""
    from opttree.kernels.choice import RECHECK_AFTER

    needs_onednn()
    names = linears.candidates(torch.float32, 3)
    calls = fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    weights = [torch.randn(24, 16) for _ in range(4)]
    products = 0

    def run(n):
        nonlocal products
        for _ in range(n):
            fast_linear(torch.randn(3, 16), weights[products % 4])
            products += 1

    run(TRIALS * len(names))
    assert linears.decisions() == {key(3, weights[0]): "stock"} and not linears.settled()  # provisional
    trials = sum(name != "stock" for name, _, _ in calls)
    run(RECHECK_AFTER - 1)  # warm-up: every weight met again, but too few products yet
    assert sum(name != "stock" for name, _, _ in calls) == trials and not linears.settled()
    while not linears.settled() and products < PRODUCTS:
        run(1)
    assert linears.settled() and linears.decisions() == {key(3, weights[0]): "stock"}
    assert sum(name != "stock" for name, _, _ in calls) == trials + TRIALS * (len(names) - 1)  # one more round


def test_the_re_check_times_a_packed_kernel_only_on_weights_packed_before_it(monkeypatch):
    """A copy packed just before its product is hot in the cache: the re-check makes no packed copy
    and times oneDNN only on weights its first trials packed; the other weights stay unpacked."""
    needs_onednn()
    names = linears.candidates(torch.float32, 3)
    calls = fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    weights = [torch.randn(24, 16) for _ in range(12)]  # twelve layers of one shape
    i = 0
    while not linears.decisions():
        fast_linear(torch.randn(3, 16), weights[i % 12])
        i += 1
    packed = {id(w) for w in weights if linears.is_packed(w)}
    assert 0 < len(packed) < 12  # the first trials packed a few (oneDNN's turns), stock then packs none
    rechecked = len(calls)
    while not linears.settled() and i < PRODUCTS:
        fast_linear(torch.randn(3, 16), weights[i % 12])
        i += 1
    assert linears.settled()
    assert {id(w) for w in weights if linears.is_packed(w)} == packed  # no copy made in the re-check
    onednn_after = [w for name, _, w in calls[rechecked:] if name in linears.PACKED]
    assert len(onednn_after) >= TRIALS * (len(names) - 2) and set(onednn_after) <= packed


def test_a_weight_bigger_than_any_cache_runs_each_round_at_one_product(monkeypatch):
    """An LM head: its first trials all at its first product, its re-check all at one product after
    warm-up (its second meeting, RECHECK_AFTER products later)."""
    from opttree.kernels.choice import RECHECK_AFTER

    big, small = torch.randn(64, 16), torch.randn(8, 16)
    monkeypatch.setattr(linears, "IN_PLACE_BYTES", big.numel() * big.element_size())
    names = linears.candidates(torch.float32, 3)
    calls = fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    x = torch.randn(3, 16)
    fast_linear(x, big)
    assert len(calls) == TRIALS * len(names) and linears.decisions()[key(3, big)] == "stock"
    fast_linear(x, big)  # warm-up: the provisional kernel meets it
    for _ in range(RECHECK_AFTER):
        fast_linear(x, small)
    before = len(calls)
    fast_linear(x, big)  # met again: the whole re-check now
    assert len(calls) == before + TRIALS * len(names)
    assert key(3, big) in linears._choice.final()


def test_a_product_whose_kernel_is_stock_runs_f_linears_own_ops(monkeypatch):
    """Plain decoding's hot path: once stock is chosen, a 3-D input goes to F.linear as given, with
    exactly the aten ops F.linear runs outside the block (no reshape in and out around it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    w, x = torch.randn(24, 16), torch.randn(1, 1, 16)
    for _ in range(PRODUCTS):
        fast_linear(x, w)
    assert linears.decisions() == {key(1, w): "stock"}
    with Ops() as plain:
        expected = REAL_STOCK(x, w)
    with Ops() as fast:
        out = fast_linear(x, w)
    assert torch.equal(out, expected) and fast.ops == plain.ops


def test_a_layer_remembers_the_shapes_that_take_stock_for_good(monkeypatch):
    """Once a shape's kernel is final stock, a swapped layer sends it to F.linear without the choice's
    lookups (fast_linear not called); another thread count and forget_decisions() look again."""
    fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    layer, x = torch.nn.Linear(16, 24), torch.randn(1, 1, 16)
    real, looked = linears.fast_linear, []
    monkeypatch.setattr(linears, "fast_linear", lambda *a, **k: looked.append(1) or real(*a, **k))
    threads = torch.get_num_threads()
    try:
        with linears.fast_linears(layer):
            for _ in range(PRODUCTS):
                layer(x)
            assert linears.settled() and linears.decisions() == {key(1, layer.weight): "stock"}
            looked.clear()
            for _ in range(10):
                torch.testing.assert_close(layer(x), REAL_STOCK(x, layer.weight, layer.bias))
            assert looked == []
            torch.set_num_threads(threads + 1)
            layer(x)
            assert len(looked) == 1  # another thread count: its own choice
            torch.set_num_threads(threads)
            linears.forget_decisions()
            layer(x)
            assert len(looked) == 2  # forgotten: chosen again
    finally:
        torch.set_num_threads(threads)


def test_a_row_count_met_once_takes_stock_and_is_tried_when_it_comes_again(monkeypatch):
    """A prompt's prefill of 45 rows through 6 layers: stock for every product, no trial, no packed
    copy; the same row count again (a second prompt of that length) starts the trials. A power of two
    (a verification size) is tried at its first meeting (control)."""
    calls = fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    weights = [torch.randn(24, 16) for _ in range(6)]
    for w in weights:  # the prefill
        fast_linear(torch.randn(45, 16), w)
    assert {name for name, _, _ in calls} == {"stock"} and linears.decisions() == {}
    assert not any(linears.is_packed(w) for w in weights)
    for w in weights:  # another prompt of 45 tokens
        fast_linear(torch.randn(45, 16), w)
    assert {name for name, _, _ in calls} > {"stock"}  # trying now
    calls.clear()
    for w in weights:  # a verification of 32 rows
        fast_linear(torch.randn(32, 16), w)
    assert {name for name, _, _ in calls} > {"stock"}


@pytest.mark.parametrize("faster, kept", [(0.97, "stock"), (0.90, "onednn")])
def test_stock_is_replaced_only_by_a_kernel_clearly_faster(faster, kept, monkeypatch):
    """Medians of a few products move by several per cent on a shared machine: oneDNN 3 % faster than
    stock in both rounds leaves stock; 10 % faster takes over (control)."""
    needs_onednn()
    fake_costs(monkeypatch, lambda name, rows, i: {"stock": 1.0, "onednn": faster}.get(name, 2.0))
    weights = [torch.randn(24, 16) for _ in range(4)]
    for i in range(PRODUCTS):
        fast_linear(torch.randn(4, 16), weights[i % 4])
    assert linears.settled() and linears.decisions() == {key(4, weights[0]): kept}


@pytest.mark.parametrize("times, kept", [
    ({"stock": [1.0, 1.0, 1.0], "onednn": [0.80, 0.85, 1.05]}, "stock"),  # median 15 % lower, one trial slower than stock's
    ({"stock": [1.0, 1.0, 1.0], "onednn": [0.96, 0.97, 0.97]}, "stock"),  # every trial faster, the median 3 % lower
    ({"stock": [1.0, 1.0, 1.0], "onednn": [0.80, 0.85, 0.90]}, "onednn"),  # control: clearly faster
    ({"stock": [1.0, 1.0, 2.0], "onednn": [0.90, 0.90, 0.90]}, "onednn"),  # a hiccup in a stock trial changes nothing
    ({"stock": [1.0, 1.0, 1.0], "onednn": [0.80, 0.85, 1.05], "weight_major": [0.9, 0.9, 0.9]}, "stock"),  # the best median or stock
])
def test_a_kernel_within_noise_of_stock_leaves_stock(times, kept):
    """Two kernels within a shared machine's noise of each other (bfloat16 on an AVX-512 CPU, whose stock
    matmul is oneDNN's too) were chosen by chance, per shape, on medians of 3: a kernel replaces stock
    only where its median is STOCK_MARGIN lower and none of its trials is as slow as stock's fastest."""
    from opttree.kernels.choice import pick

    assert pick(times) == kept


def test_the_last_level_cache_is_read_as_linux_lists_it(tmp_path):
    from opttree.kernels.cpu import cache_size_bytes, read_last_level_cache

    for i, (level, size) in enumerate([(1, "32K"), (1, "32K"), (2, "1024K"), (3, "32768K")]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{i}" / "size").write_text(f"{size}\n")
    assert read_last_level_cache(tmp_path) == 32 << 20  # the Zen 4 VM's: L3, 32 MiB
    assert cache_size_bytes("2M") == 2 << 20 and cache_size_bytes("512") == 512 and cache_size_bytes("n/a") is None
    assert read_last_level_cache(tmp_path / "none") is None  # no /sys: the constant stands
    assert linears.in_place_bytes(32 << 20) == 64 << 20  # twice a 32 MiB cache
    assert linears.in_place_bytes(1 << 30) == linears.IN_PLACE_BYTES  # never above the constant
    assert linears.in_place_bytes(0) == linears.IN_PLACE_BYTES


def test_an_lm_head_over_twice_the_cache_settles_in_two_meetings(monkeypatch):
    """SmolLM2's LM head in float32 (108 MiB, under IN_PLACE_BYTES) on a Zen 4 (32 MiB L3): its trials ran one
    product a forward, ~20 forwards a row count, and calibration timed the forward that packed its copy.
    Sized against the cache, its first trials run at its first meeting and its re-check at one later
    meeting. Control: under a cache as big as the weight, one trial a meeting as before."""
    from opttree.kernels.choice import RECHECK_AFTER

    big, small = torch.randn(64, 16), torch.randn(8, 16)
    names = linears.candidates(torch.float32, 3)
    calls = fake_costs(monkeypatch, lambda name, rows, i: 1.0 if name == "stock" else 2.0)
    x = torch.randn(3, 16)

    def meetings_until_settled(cache_bytes: int) -> int:
        monkeypatch.setattr(linears, "last_level_cache_bytes", lambda: cache_bytes)
        linears.forget_decisions()
        met = 0
        while key(3, big) not in linears._choice.final() and met < 100:
            fast_linear(x, big)
            met += 1
            for _ in range(RECHECK_AFTER):
                fast_linear(x, small)
        return met

    weight_bytes = big.numel() * big.element_size()
    assert meetings_until_settled(weight_bytes // 2) == 3  # trials, the provisional kernel's meeting, the re-check
    assert meetings_until_settled(weight_bytes) > 2 * TRIALS * len(names)  # one trial a meeting
