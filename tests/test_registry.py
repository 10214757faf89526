"""One record per strategy and per verifier (opttree.tree.registry): a strategy registered with one record
is accepted by TreeConfig, grown by grow_tree through its record, and taken or refused by "auto" as its
record says; the docs list exactly the registered names. Negative control: before the records, a new
strategy had to be added to four places, and one missing from integration/defaults.AUTO_STRATEGIES
made "auto" fall back to 60 / 0.5 without a word (test_a_strategy_registered_with_one_record_runs_everywhere)."""

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from clocks import HANG_GUARD
from opttree import TreeConfig
from opttree.integration import contract_page
from opttree.integration.defaults import TreeArguments, auto_applies, resolve
from opttree.tree import registry
from opttree.tree.builder import grow_opt_tree
from opttree.tree.plan import StepPlan
from opttree.tree.registry import Strategy, Verifier
from opttree.tree.strategies import build_tree
from test_builder import synthetic_probs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "arguments.md"


def counting_strategy(monkeypatch, name: str, follows_plan: bool, draws: bool = False) -> list:
    """Registers ``name``, an OPT-Tree under another name whose builder records each call's keywords."""
    calls = []

    def grow(root_probs, config, max_depth=None, **kw):
        calls.append(dict(kw))
        kw.pop("generator", None)
        return (yield from grow_opt_tree(root_probs, config, max_depth, **kw))

    record = Strategy(name=name, grow=grow, summary="a test's tree", follows_plan=follows_plan, draws=draws)
    monkeypatch.setitem(registry.STRATEGIES, name, record)
    return calls


def expand(pool, frontier):
    return synthetic_probs(())[None, :].expand(len(frontier), -1)


def test_a_strategy_registered_with_one_record_runs_everywhere(monkeypatch):
    """Validation, "auto" and grow_tree all read the one record: nothing else names the strategy."""
    with pytest.raises(ValueError, match=r"strategy must be one of \('opt', .*got 'wide'"):
        TreeConfig(strategy="wide")  # control: unknown before it is registered
    calls = counting_strategy(monkeypatch, "wide", follows_plan=True)
    assert "wide" in registry.strategy_names()
    assert TreeConfig(strategy="wide").strategy == "wide"
    arguments = TreeArguments.of(strategy="wide")
    assert auto_applies(arguments, can_calibrate=True)
    assert resolve(arguments) == TreeConfig(strategy="wide", nodes="auto", threshold="auto")
    config = TreeConfig(strategy="wide", nodes=8, threshold=0.0, max_depth=3)
    built = build_tree(synthetic_probs(()), expand, config, plan=StepPlan(nodes=8, threshold=0.0, size=lambda p: 3))
    assert len(calls) == 1 and "generator" not in calls[0]  # its builder ran, given no generator: it does not draw
    assert len(built.tree) == 3  # it follows the plan: the plan's size rule cut its tree to the best 3


def test_auto_refuses_a_strategy_whose_record_says_it_does_not_follow_the_plan(monkeypatch):
    calls = counting_strategy(monkeypatch, "drawn", follows_plan=False, draws=True)
    arguments = TreeArguments.of(strategy="drawn")
    assert not auto_applies(arguments, can_calibrate=True)
    assert resolve(arguments) == TreeConfig(strategy="drawn")  # the fixed defaults, 60 / 0.5
    config = TreeConfig(strategy="drawn", nodes=8, threshold=0.0, max_depth=3)
    generator = torch.Generator().manual_seed(0)
    built = build_tree(synthetic_probs(()), expand, config, generator=generator,
                       plan=StepPlan(nodes=8, threshold=0.0, size=lambda p: 3))
    assert calls[0]["generator"] is generator  # it draws: grow_tree hands it generate()'s generator
    assert len(built.tree) > 3  # its tree keeps its own order and size: the plan's size rule is not applied


def test_a_verifier_record_decides_validation_auto_and_the_walk(monkeypatch):
    from opttree.verify.walk import verify

    with pytest.raises(ValueError, match=r"verifier must be one of \('match', 'rrs', 'traversal'\), got 'strict'"):
        TreeConfig(verifier="strict")
    walked = []

    def walk(built, tree, logits, process, generator):
        walked.append(len(tree))
        return "accepted"

    monkeypatch.setitem(registry.VERIFIERS, "strict", Verifier(name="strict", summary="a test's rule",
                                                               sized_by_auto=False, sampling_walk=walk))
    config = TreeConfig(verifier="strict")
    assert not auto_applies(TreeArguments.of(verifier="strict"), can_calibrate=True)  # its record says so
    monkeypatch.setitem(registry.VERIFIERS, "strict", replace(registry.VERIFIERS["strict"], sized_by_auto=True))
    assert auto_applies(TreeArguments.of(verifier="strict"), can_calibrate=True)
    built = build_tree(synthetic_probs(()), expand, TreeConfig(nodes=4, threshold=0.0, max_depth=2))
    logits = torch.zeros(len(built.tree) + 1, synthetic_probs(()).shape[0])
    assert verify(built, built.tree, logits, None, config, process=lambda emitted, row: row) == "accepted"
    assert walked == [len(built.tree)]  # sampling: its record's walk


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match="strategy 'opt' is registered twice"):
        registry.register_strategies(registry.STRATEGIES["opt"])
    assert registry.strategy("opt").grow is grow_opt_tree  # the first record stands


def quoted_names(row: str) -> list[str]:
    """The names a docs row lists: each quoted name followed by its words in parentheses."""
    return re.findall(r'"([a-z_]+)" \(', row)


def test_the_arguments_page_lists_exactly_the_registered_names():
    lines = {line.split("|")[1].strip(): line for line in PAGE.read_text().splitlines() if line.startswith("| `")}
    assert quoted_names(lines["`strategy`"]) == list(registry.STRATEGIES)
    assert quoted_names(lines["`verifier`"]) == list(registry.VERIFIERS)
    strategies, verifiers = registry.not_auto()
    auto = contract_page.auto_paragraph()
    assert strategies == ["sampled"] and verifiers == ["rrs", "traversal"]
    assert all(f'strategy="{name}"' in auto for name in strategies) and all(f'"{name}"' in auto for name in verifiers)
    assert auto in PAGE.read_text()


def test_a_new_record_changes_the_auto_paragraph(monkeypatch):
    """Negative control of the page's derivation: a record that cannot take "auto" is named there."""
    counting_strategy(monkeypatch, "drawn", follows_plan=False)
    assert '`strategy="sampled"` and `strategy="drawn"`' in contract_page.auto_paragraph()


def test_the_records_are_registered_before_any_config_is_checked():
    """The records are registered by the modules that implement them (tree/strategies.py, verify/walk.py):
    importing TreeConfig alone, in a fresh interpreter, already knows every one of them."""
    code = ("from opttree.tree.config import TreeConfig\n"
            "from opttree.tree import registry\n"
            "TreeConfig(strategy='sampled', verifier='traversal')\n"
            "print(','.join(registry.strategy_names()), ','.join(registry.verifier_names()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [",".join(registry.STRATEGIES), ",".join(registry.VERIFIERS)]
