"""The registry is the one place a published layout is named (issue 59): each layout is one class of
opttree.loading.eagle, looked up by config.json's ``architectures``. A tiny layout registered here
(EAGLE-3's compute, its one layer under ``block.``, no export) loads through opttree.load_draft and
drafts the q of the EAGLE-3 folder it was renamed from, with no other edit; unregistered, it is
refused by name again. And no module outside opttree/loading/eagle/ compares a layout's name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import opttree
from eagle_folders import target_for, write_eagle3
from opttree.loading import eagle as registry
from opttree.loading.eagle import Eagle1Head, Eagle3Head, SpeculatorsHead
from opttree.loading.eagle_folder import is_eagle_head
from test_eagle_heads import _q_pair, prompt, state_of

ARCHITECTURE = "TinyBlockEagle3ForTest"
PREFIX = "block."


class TinyBlockHead(Eagle3Head):
    """A test's layout: an EAGLE-3 head whose folder names its layer ``block.*``; it has no export."""

    kind = "tinyblock"
    cannot_export = "no engine serves the test's block layout"

    @classmethod
    def key_map(cls, state):
        renamed = {"midlayer." + k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in state.items()}
        return super().key_map(renamed)


def tiny_folder(tmp_path: Path, target) -> tuple[Path, Path]:
    """An EAGLE-3 folder and its copy in the tiny layout (another architecture, ``block.`` names)."""
    source = write_eagle3(tmp_path / "eagle3", target)
    folder = tmp_path / "tiny"
    folder.mkdir()
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = [ARCHITECTURE]
    (folder / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    state = {(PREFIX + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state_of(source).items()}
    save_file(state, str(folder / "model.safetensors"))
    return source, folder


def test_a_layout_registered_in_one_line_loads_through_load_draft(tmp_path):
    target = target_for("llama")
    source, folder = tiny_folder(tmp_path, target)
    with pytest.raises(ValueError, match=f"\\['{ARCHITECTURE}'\\] is no draft head's architecture"):
        opttree.load_draft(folder, target)  # negative control: unregistered, refused by name
    assert not is_eagle_head(folder)
    registry.register(ARCHITECTURE, TinyBlockHead)
    try:
        assert is_eagle_head(folder)
        head, reference = opttree.load_draft(folder, target), opttree.load_draft(source, target)
        assert type(head) is TinyBlockHead and type(reference) is Eagle3Head
        ids = prompt(0)
        for mine, theirs in zip(_q_pair(head, target, ids), _q_pair(reference, target, ids)):
            assert torch.equal(mine, theirs)
        assert opttree.export_draft(reference, tmp_path / "out").is_dir()  # the registered layouts still export
        with pytest.raises(ValueError, match="a tinyblock head cannot be exported: no engine serves"):
            opttree.export_draft(head, tmp_path / "out2")  # its declared "cannot export", by name
        with pytest.raises(ValueError, match="layout='tinyblock': export writes 'eagle3' or 'eagle1'"):
            opttree.export_draft(head, tmp_path / "out2", layout="tinyblock")
        with pytest.raises(ValueError, match="TinyBlockEagle3ForTest, .*LlamaForCausalLMEagle3|LlamaForCausalLMEagle3.*"
                                             "TinyBlockEagle3ForTest"):
            opttree.load_draft(write_eagle3(tmp_path / "medusa", target, architecture="MedusaModel"), target)
    finally:
        registry.unregister(ARCHITECTURE)
    with pytest.raises(ValueError, match="is no draft head's architecture"):
        opttree.load_draft(folder, target)


def test_the_registry_maps_each_published_architecture_to_its_class():
    assert registry.ARCHITECTURES["LlamaForCausalLMEagle3"] is Eagle3Head
    assert registry.ARCHITECTURES["Eagle3LlamaForCausalLM"] is Eagle3Head
    assert registry.ARCHITECTURES["Eagle3Speculator"] is SpeculatorsHead
    assert {a for a, c in registry.ARCHITECTURES.items() if c is Eagle1Head} == {
        "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}
    assert registry.export_layouts() == ("eagle3", "eagle1")
    no_weights = lambda: pytest.fail("the weights were read for an architecture that decides alone")  # noqa: E731
    assert registry.head_class({"architectures": ["Eagle3LlamaForCausalLM"]}, Path("x"), no_weights) is Eagle3Head
    assert registry.head_class({"speculators_model_type": "eagle3"}, Path("x"), no_weights) is SpeculatorsHead
    plain = {"architectures": ["Qwen2ForCausalLM"]}
    assert registry.head_class(plain, Path("x"), lambda: {"fc.weight", "layers.0.mlp.up_proj.weight"}) is Eagle1Head
    with pytest.raises(ValueError, match="is no draft head's architecture"):  # a plain model's own weights
        registry.head_class(plain, Path("x"), lambda: {"fc.weight", "lm_head.weight"})


# -- no layout is named by a comparison outside the layouts' own package ----------------------------

PACKAGE = Path(opttree.__file__).parent
LAYOUTS = PACKAGE / "loading" / "eagle"  # the per-layout classes and their base
COMPARISON = re.compile(r"\blayout\s*[!=]=|[!=]=\s*(?:\w+\.)*layout\b|\bc\.layout\b|\bEAGLE[13]\b|\bSPECULATORS\b")


def layout_comparisons(root: Path, allowed: Path) -> list[str]:
    """'file:line: text' for each line of ``root``'s modules outside ``allowed`` that compares a layout."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if allowed in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_module_outside_the_layouts_compares_a_layout(tmp_path):
    assert layout_comparisons(PACKAGE, LAYOUTS) == []
    # negative controls: the old conditionals are caught, and so is one in a layout-free module
    (tmp_path / "pkg" / "eagle").mkdir(parents=True)
    (tmp_path / "pkg" / "eagle" / "a.py").write_text("if layout != self.kind:\n    pass\n")
    (tmp_path / "pkg" / "b.py").write_text("x = 1\nif head.c.layout == EAGLE3:\n    pass\n")
    (tmp_path / "pkg" / "c.py").write_text("fc_bias = head_layout == EAGLE1 and bias\n")
    (tmp_path / "pkg" / "d.py").write_text("if layout == SPECULATORS:\n    pass\n")
    assert layout_comparisons(tmp_path / "pkg", tmp_path / "pkg" / "eagle") == [
        "b.py:2: if head.c.layout == EAGLE3:", "c.py:1: fc_bias = head_layout == EAGLE1 and bias",
        "d.py:1: if layout == SPECULATORS:"]
