"""What moved from opttree.distill to opttree.loading (issue: decoding never enters training) still
answers under its old path for one release, with a DeprecationWarning naming the new one; the new
paths warn about nothing."""

import importlib
import subprocess
import sys
import warnings

import pytest

MODULES = ["files", "draft_dtype", "dtype_probe", "machine", "turns"]


@pytest.mark.parametrize("name", MODULES)
def test_a_moved_module_warns_and_is_the_new_one(name):
    sys.modules.pop(f"opttree.distill.{name}", None)
    with pytest.warns(DeprecationWarning, match=rf"opttree\.distill\.{name} moved to opttree\.loading\.{name}"):
        old = importlib.import_module(f"opttree.distill.{name}")
    assert old is importlib.import_module(f"opttree.loading.{name}")  # one module: patches reach both


@pytest.mark.parametrize("old, name, new", [
    ("opttree.distill", "load_draft", "opttree.loading"),
    ("opttree.distill", "ReducedVocabHead", "opttree.loading.draft_model"),
    ("opttree.distill", "save_draft", "opttree.loading.draft_model"),
    ("opttree.distill.model", "load_draft", "opttree.loading"),
    ("opttree.distill.model", "ReducedVocabHead", "opttree.loading.draft_model"),
    ("opttree.distill.model", "META_FILE", "opttree.loading.draft_model"),
    ("opttree.distill.head", "save_head", "opttree.loading.head_file"),
    ("opttree.distill.head", "load_head", "opttree.loading.head_file"),
    ("opttree.distill.head", "HEAD_FORMAT", "opttree.loading.head_file"),
])
def test_a_moved_name_warns_and_is_the_new_one(old, name, new):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)


def test_names_that_never_existed_are_still_attribute_errors():
    import opttree.distill.head as head
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        head.nope  # noqa: B018


def test_the_new_paths_and_training_itself_warn_nothing():
    """In a fresh process: the package's face, the runtime and training's own modules import and
    load without a DeprecationWarning (control: the old path does warn there)."""
    code = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
from opttree import load_draft
from opttree.loading import draft_dtype, dtype_probe, files, machine, turns
import opttree.distill.cli, opttree.distill.head_train, opttree.distill.train, opttree.distill.precision
import opttree.bench.cli
try:
    from opttree.distill import load_draft as old
except DeprecationWarning as w:
    print("warned:", w)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warned: opttree.distill.load_draft moved to opttree.loading.load_draft" in out.stdout


def test_top_level_load_draft_is_the_loader():
    import opttree
    from opttree.loading import load_draft
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert opttree.load_draft is load_draft
