"""docs/arguments.md is the contract written out: generated from opttree.integration.contract by
`opttree arguments > docs/arguments.md`, and this test fails when the page and the contract disagree."""

from pathlib import Path

from opttree import cli
from opttree.integration import contract, contract_page
from opttree.integration.defaults import TREE_ARGS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "arguments.md"


def test_the_page_is_the_contract_as_generated():
    assert PAGE.read_text() == contract_page.markdown(), f"docs/arguments.md is stale: run `{contract_page.COMMAND}`"


def test_every_argument_of_the_contract_has_its_row():
    text = PAGE.read_text()
    for table in (contract.ADDED, contract.HONOURED, contract.REFUSED, contract.NOT_APPLYING):
        for name in table:
            assert f"| `{name}` |" in text, name
    for name, refusal in contract.REFUSED.items():  # each check named where it lives
        for check in refusal.checked_by:
            assert f"{check.__module__.removeprefix('opttree.')}.{check.__name__}" in text, name


def test_the_added_arguments_are_the_ones_generate_takes():
    assert set(contract.ADDED) == set(TREE_ARGS) | {"draft_model", "generator"}


def test_a_changed_contract_makes_the_page_stale(monkeypatch):
    """Negative control: a new honoured argument, or a changed fix, changes the page."""
    page = PAGE.read_text()
    monkeypatch.setitem(contract.HONOURED, "fresh_option", "a processor at every node")
    assert contract_page.markdown() != page and "| `fresh_option` |" in contract_page.markdown()
    monkeypatch.delitem(contract.HONOURED, "fresh_option")
    assert contract_page.markdown() == page
    monkeypatch.setitem(contract.REFUSED, "num_beams", contract.Refusal("another fix"))
    assert "another fix" in contract_page.markdown()


def test_the_command_prints_the_page(capsys):
    assert cli.main(["arguments"]) == 0
    assert capsys.readouterr().out == PAGE.read_text()
