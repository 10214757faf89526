"""The refusals a new user met (issue 57, item 2), each as the user meets it (through the command where
there is one): one line that names the fix, before any model loads, and nothing half-written.

Before: `opttree export HEAD OUT --target /missing` printed a 35-line traceback; a mistyped folder was
"opttree_draft.json is missing"; a pytorch_model.bin that is no pickle was "a pickle that would run code"
with torch's advice to pass weights_only=False; "norm_before_residual": "true" had to be "a positive bool";
an export into a folder holding a draft left its stale files (the reload failed); `opttree bench --methods
plain,assisted --draft <EAGLE folder>` dropped assisted and exited 0; an exported float16 head came out
float32; and load_smollm2()'s model could not be saved as a folder other engines load."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import opttree
from eagle_folders import target_for, write_eagle3
from opttree import cli
from opttree.bench import models as bench_models
from opttree.drafters.head.eagle import EagleHead
from test_bench_arguments import Loaded
from test_bench_arguments import no_loading as bench_loaders_refused  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_loading(bench_loaders_refused, monkeypatch):
    """from_pretrained and the bench's loaders raise Loaded: a command that reaches one checked too late."""
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        raise Loaded(args[0] if args else None)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


def one_line(capsys, argv, prog: str) -> str:
    """``opttree ARGV``'s stderr, which must be one line starting with ``prog: error:``, after exit code 2."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"{prog}: error: "), err
    return err.strip()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(target, its saved folder, a head's folder for it)."""
    tmp = tmp_path_factory.mktemp("refusals")
    target = target_for("llama")
    target.save_pretrained(tmp / "target")
    return target, tmp / "target", write_eagle3(tmp / "head", target)


# ---------------------------------------------------------------------------------------------
# 1, 2: a target or a draft that is not there


def test_export_with_a_missing_target_is_one_line_in_a_process_of_its_own(setup, tmp_path):
    _, _, head = setup
    out = subprocess.run([sys.executable, "-m", "opttree", "export", str(head), str(tmp_path / "out"),
                          "--target", "/missing"], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("opttree export: error: --target /missing: no such folder (/missing); give the "
                                 "folder of a from_pretrained model (config.json) or a Hub id org/name")
    assert not (tmp_path / "out").exists()


def test_every_export_argument_is_checked_before_a_model_loads(setup, tmp_path, capsys, no_loading):
    _, target_dir, head = setup
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "opttree_draft.json").write_text("{}")
    out, t = str(tmp_path / "out"), ["--target", str(target_dir)]
    cases = [
        (["/typo", out, *t], r"/typo: no such folder \(/typo\); pass the folder `opttree distill` wrote, a published "
                             r"EAGLE head's folder"),
        ([str(a_file), out, *t], "a_file is a file, not a folder; pass the draft's folder"),
        ([str(head), str(full), *t], rf"OUT {full} is not empty \(it holds opttree_draft.json\); choose a new or "
                                     r"empty folder, or remove that one first"),
        ([str(head), str(a_file), *t], rf"OUT {a_file} is a file, not a folder; choose a new or empty folder"),
        ([str(head), out, "--target", str(tmp_path)], rf"--target {tmp_path}: that folder holds no config.json"),
        ([str(head), out, "--target", str(a_file)], rf"--target {a_file}: a file, not a folder"),
        ([str(head), out, *t, "--dtype", "float8"], r"argument --dtype: invalid choice: 'float8' \(choose from "
                                                    r"'?float32'?, '?bfloat16'?, '?float16'?\)"),
    ]
    for argv, words in cases:
        line = one_line(capsys, ["export", *argv], "opttree export")
        assert re.search(words, line), (argv, line)
        assert "opttree_draft.json is missing" not in line
    assert not (tmp_path / "out").exists() and sorted(os.listdir(full)) == ["opttree_draft.json"]
    with pytest.raises(Loaded):  # control: good arguments do reach the loader
        cli.main(["export", str(head), out, *t])


def test_a_target_that_does_not_load_is_one_line_naming_it(setup, tmp_path, capsys, monkeypatch):
    from transformers import AutoConfig

    def fail(*args, **kwargs):
        raise OSError("org/absent is not a local folder and is not a valid model identifier listed on\n"
                      "'https://huggingface.co/models'\nIf this is a private repository, ...")

    monkeypatch.setattr(AutoConfig, "from_pretrained", fail)
    line = one_line(capsys, ["export", str(setup[2]), str(tmp_path / "out"), "--target", "org/absent"],
                    "opttree export")
    assert "--target org/absent: could not load it (org/absent is not a local folder" in line


def test_load_draft_of_a_missing_folder_says_so(tmp_path):
    target = target_for("llama")
    for path in ("/typo", tmp_path / "typo"):
        with pytest.raises(ValueError) as error:
            opttree.load_draft(path, target)
        assert "no such folder" in str(error.value) and "is missing" not in str(error.value)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="a_file is a file, not a folder"):
        opttree.load_draft(tmp_path / "a_file", target)
    with pytest.raises(ValueError, match=r"draft_model='/typo': no such folder \(/typo\); a string must be"):
        opttree.speculative(target).generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, draft_model="/typo")
    empty = tmp_path / "empty"
    empty.mkdir()  # control: an existing folder without the file still names the file
    with pytest.raises(ValueError, match="opttree_draft.json is missing"):
        opttree.load_draft(empty, target)


# ---------------------------------------------------------------------------------------------
# 3: a pytorch_model.bin that is not what it claims


class Gadget:
    """Not a tensor: torch.load(weights_only=True) refuses to build it."""


def _torch_bytes(state, **kw) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf, **kw)
    return buf.getvalue()


def _zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", "hello")
    return buf.getvalue()


NOT_A_CHECKPOINT = r"is not a torch checkpoint \(neither torch's zip archive nor a torch pickle: another kind of file, "
CORRUPT = r"is a corrupt torch checkpoint \(torch.load: "
RESTORE = r"restore the head's weights \(as model.safetensors where its publisher has one\)$"
BINS = {
    "text": (lambda s: b"<html>404 Not Found</html>", NOT_A_CHECKPOINT + r"or corrupt\); " + RESTORE),
    "random": (lambda s: bytes(range(7, 250)), NOT_A_CHECKPOINT),
    "protocol-0 pickle": (lambda s: pickle.dumps([1, 2], protocol=0), NOT_A_CHECKPOINT),
    "empty": (lambda s: b"", r"is empty \(0 bytes\): a download or copy cut short; " + RESTORE),
    "safetensors": (lambda s: __import__("safetensors.torch").torch.save(s),
                    r"is a safetensors file under a pickle's name; rename it to model.safetensors$"),
    "truncated": (lambda s: _torch_bytes(s)[:2000],
                  CORRUPT + r"RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
                            r"directory\); " + RESTORE),
    "foreign zip": (lambda s: _zip_bytes(), CORRUPT + "RuntimeError"),
    "bad legacy pickle": (lambda s: b"\x80\x02" + bytes(range(60, 120)), CORRUPT),
    "a gadget": (lambda s: _torch_bytes({**s, "extra": Gadget()}),
                 r"is a pickle that builds [\w.]*Gadget, not only tensors: unpickling it could run code, and "
                 r"opttree never does; get the head as model.safetensors"),
}


@pytest.mark.parametrize("kind", list(BINS))
def test_a_bad_pytorch_model_bin_is_named_for_what_it_is(setup, kind, tmp_path, capsys, no_loading):
    target, target_dir, _ = setup
    folder = write_eagle3(tmp_path / "head", target, pickled=True)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    make, words = BINS[kind]
    (folder / "pytorch_model.bin").write_bytes(make(state))
    with pytest.raises(ValueError) as error:
        opttree.load_draft(folder, target)
    message = str(error.value)
    assert "\n" not in message and re.search(words, message), message
    assert "weights_only" not in message  # torch's advice (to pass weights_only=False) is never repeated
    assert ("run code" in message) == (kind == "a gadget")  # only a pickle of more than tensors is one that would
    line = one_line(capsys, ["export", str(folder), str(tmp_path / "out"), "--target", str(target_dir)],
                    "opttree export")
    assert re.search(words, line) and not (tmp_path / "out").exists()


def test_a_good_legacy_pickle_still_loads(tmp_path):
    """Control: torch's legacy format (a protocol-2 pickle, not a zip) passes the first-bytes check."""
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target, pickled=True)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    (folder / "pytorch_model.bin").write_bytes(_torch_bytes(state, _use_new_zipfile_serialization=False))
    assert isinstance(opttree.load_draft(folder, target), EagleHead)


# ---------------------------------------------------------------------------------------------
# 4: a field of the wrong kind


@pytest.mark.parametrize("key, value, words", [
    ("norm_before_residual", "true", r"'norm_before_residual' must be a JSON boolean \(true or false, unquoted\), "
                                     r"got \"true\"; correct the head's config.json"),
    ("norm_before_residual", 1, r"must be a JSON boolean \(true or false, unquoted\), got 1;"),
    ("hidden_size", "32", r"'hidden_size' must be a whole number >= 1, got \"32\";"),
    ("intermediate_size", 0, r"'intermediate_size' must be a whole number >= 1, got 0;"),
    ("rms_norm_eps", "1e-5", r"'rms_norm_eps' must be a finite number > 0, got \"1e-5\";"),
    ("rms_norm_eps", float("inf"), r"'rms_norm_eps' must be a finite number > 0, got Infinity;"),
])
def test_a_field_of_the_wrong_kind_says_which_kind(setup, key, value, words, tmp_path, capsys, no_loading):
    target, target_dir, _ = setup
    folder = write_eagle3(tmp_path / "head", target, **{key: value})
    with pytest.raises(ValueError) as error:
        opttree.load_draft(folder, target)
    assert re.search(words, str(error.value)) and "positive" not in str(error.value), str(error.value)
    assert re.search(words, one_line(capsys, ["export", str(folder), str(tmp_path / "out"), "--target",
                                              str(target_dir)], "opttree export"))


# ---------------------------------------------------------------------------------------------
# 5: export into a folder that holds a draft


def test_export_refuses_a_folder_that_holds_anything_and_leaves_it_as_it_was(setup, tmp_path):
    target, _, head_dir = setup
    head = opttree.load_draft(head_dir, target)
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "opttree_draft.json").write_text('{"format": "opttree-feature-head/1"}')
    (stale / "model.safetensors").write_bytes(b"old")
    with pytest.raises(ValueError, match=rf"^{stale} is not empty \(it holds model.safetensors, opttree_draft.json\); "
                                         r"choose a new or empty folder, or remove that one first$"):
        opttree.export_draft(head, stale)
    assert (stale / "model.safetensors").read_bytes() == b"old" and len(os.listdir(stale)) == 2
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder, and a new one, take the export; it reloads
    for folder in (empty, tmp_path / "new" / "deeper"):
        assert opttree.export_draft(head, folder) == folder
        assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
        assert isinstance(opttree.load_draft(folder, target), type(head))


def test_an_export_that_fails_midway_leaves_nothing(setup, tmp_path, monkeypatch):
    import safetensors.torch

    target, _, head_dir = setup
    head = opttree.load_draft(head_dir, target)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    for folder in (tmp_path / "new", tmp_path / "empty"):
        folder.parent.mkdir(exist_ok=True)
        if folder.name == "empty":
            folder.mkdir()
        with pytest.raises(OSError, match="No space left"):
            opttree.export_draft(head, folder)
        assert not folder.exists() or os.listdir(folder) == []
    assert sorted(os.listdir(tmp_path)) == ["empty"]  # no partial folder left beside it


# ---------------------------------------------------------------------------------------------
# 6: `opttree bench` with a method its drafts cannot run


def test_bench_refuses_assisted_with_a_head_and_no_assistant(setup, tmp_path, capsys, no_loading):
    _, _, head = setup
    line = one_line(capsys, ["bench", "--methods", "plain,assisted", "--draft", str(head)], "opttree bench")
    assert line == (f"opttree bench: error: --methods assisted: HF assisted generation runs a draft model, and --draft "
                    f"{head} is a feature head; give --assistant PATH (a draft model: a distilled draft folder, a "
                    "from_pretrained path or truncated:N), or drop it from --methods")
    line = one_line(capsys, ["bench", "--methods", "plain,opttree"], "opttree bench")
    assert "--methods opttree: needs a draft; give --draft (a distilled folder" in line
    line = one_line(capsys, ["bench", "--opttree", "nodes=4"], "opttree bench")
    assert "--opttree nodes=4: needs a draft; give --draft" in line
    # controls: with --assistant, with the default methods (assisted then dropped, not asked for) and with
    # a draft model (a from_pretrained folder), the command goes on to load the models
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    for argv in (["--methods", "plain,assisted", "--draft", str(head), "--assistant", "truncated:1"],
                 ["--draft", str(head)], ["--methods", "plain,assisted", "--draft", str(model)], []):
        with pytest.raises(Loaded):
            cli.main(["bench", *argv])


def test_the_head_spec_is_read_without_a_model(setup, tmp_path):
    _, _, head = setup
    assert bench_models.is_head_spec(str(head))
    assert bench_models.is_head_spec(str(ROOT / "drafts" / "smollm2-135m-head"))
    assert not bench_models.is_head_spec(str(ROOT / "drafts" / "smollm2-135m-draft"))  # a draft model's folder
    assert not any(bench_models.is_head_spec(s) for s in (None, "none", "truncated:2", str(tmp_path)))


# ---------------------------------------------------------------------------------------------
# 7: export keeps the head's dtype, and converts on request


def _half_folder(tmp_path, target, dtype=torch.float16) -> Path:
    folder = write_eagle3(tmp_path / "half", target)
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()},
              str(folder / "model.safetensors"))
    return folder


def _floating_dtypes(folder: Path) -> set:
    return {v.dtype for v in load_file(str(folder / "model.safetensors")).values() if v.is_floating_point()}


def test_a_float16_head_exports_as_float16_and_reloads_the_same(setup, tmp_path, capsys):
    target, target_dir, _ = setup
    half = _half_folder(tmp_path, target)
    out = tmp_path / "out"
    assert cli.main(["export", str(half), str(out), "--target", str(target_dir)]) == 0
    assert _floating_dtypes(out) == {torch.float16} and json.loads((out / "config.json").read_text())[
        "torch_dtype"] == "float16"
    source, written = load_file(str(half / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(written) == set(source) and all(written[k].dtype == v.dtype and torch.equal(written[k], v)
                                               for k, v in source.items())  # a copy
    assert abs((out / "model.safetensors").stat().st_size - (half / "model.safetensors").stat().st_size) < 4096
    a, b = opttree.load_draft(half, target), opttree.load_draft(out, target)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert b.c.stored_dtype == "float16"
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        converted = tmp_path / dtype
        assert cli.main(["export", str(half), str(converted), "--target", str(target_dir), "--dtype", dtype]) == 0
        assert _floating_dtypes(converted) == {torch_dtype}
        assert json.loads((converted / "config.json").read_text())["torch_dtype"] == dtype
    back = load_file(str(tmp_path / "float32" / "model.safetensors"))
    assert all(torch.equal(back[k], v.float() if v.is_floating_point() else v) for k, v in source.items())
    # the API keeps it too, and takes the dtype by name or as a torch dtype; another is refused by name
    head = opttree.load_draft(half, target)
    assert _floating_dtypes(opttree.export_draft(head, tmp_path / "api")) == {torch.float16}
    assert _floating_dtypes(opttree.export_draft(head, tmp_path / "api32", dtype=torch.float32)) == {torch.float32}
    with pytest.raises(ValueError, match="^dtype 'float64': export writes float32, bfloat16, float16$"):
        opttree.export_draft(head, tmp_path / "api64", dtype="float64")
    assert not (tmp_path / "api64").exists()


def test_values_beyond_float16_are_refused_and_nothing_is_written(setup, tmp_path, capsys):
    target, _, head_dir = setup
    head = opttree.load_draft(head_dir, target)
    with torch.no_grad():
        head.fc.weight[0, 0] = 1e5
    with pytest.raises(ValueError, match=r"^'fc.weight' holds values beyond float16's range \(largest 65504\); export "
                                         r"it as bfloat16 or float32$"):
        opttree.export_draft(head, tmp_path / "out", dtype="float16")
    assert not (tmp_path / "out").exists()
    assert _floating_dtypes(opttree.export_draft(head, tmp_path / "b", dtype="bfloat16")) == {torch.bfloat16}


def test_a_folder_of_mixed_dtypes_exports_as_float32(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "mixed", target)
    state = load_file(str(folder / "model.safetensors"))
    state["fc.weight"] = state["fc.weight"].half()
    save_file(state, str(folder / "model.safetensors"))
    head = opttree.load_draft(folder, target)
    assert head.c.stored_dtype == "" and _floating_dtypes(opttree.export_draft(head, tmp_path / "out")) == {
        torch.float32}


# ---------------------------------------------------------------------------------------------
# 8: SmolLM2 as a plain folder


def test_smollm2_save_refuses_a_full_folder_before_loading(tmp_path, capsys, monkeypatch):
    import opttree.smollm2

    for loader in ("converted_smollm2", "_from_gguf", "_from_folder"):  # every way save_smollm2 loads
        monkeypatch.setattr(opttree.smollm2, loader, lambda *a, **k: (_ for _ in ()).throw(Loaded()))
    (tmp_path / "x").write_text("x")
    line = one_line(capsys, ["smollm2", "save", str(tmp_path)], "opttree smollm2")
    assert f"{tmp_path} is not empty (it holds x); choose a new or empty folder, or remove that one first" in line
    assert "invalid choice: 'load'" in one_line(capsys, ["smollm2", "load", str(tmp_path)], "opttree smollm2")
    with pytest.raises(Loaded):
        cli.main(["smollm2", "save", str(tmp_path / "new")])


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_saved_as_a_plain_folder_loads_without_gguf_and_decodes_the_same(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from opttree.smollm2 import GGUF_FILE, load_smollm2

    torch.set_num_threads(1)
    folder = tmp_path / "smollm2"
    assert cli.main(["smollm2", "save", str(folder)]) == 0 and "wrote" in capsys.readouterr().out
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.gguf"))
    assert not [p for p in tmp_path.iterdir() if p.name != "smollm2"]  # no partial folder left
    plain = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    assert getattr(plain, "hf_quantizer", None) is None
    source, tokenizer = load_smollm2()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Name three primary colours."}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt").input_ids, ids)
    ref = source.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(plain.generate(ids, max_new_tokens=24, do_sample=False), ref)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), source.state_dict().values()))
    assert GGUF_FILE not in json.dumps(config)
