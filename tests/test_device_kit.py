"""scripts/device_kit.py: the split plan fits every call and uses the fewest; pack -> receive -> assemble
gives back the same bytes, checked by md5; a missing or corrupted piece or another pack's manifest
is refused with exit code 2; calls may be repeated; the printed commands fit the tool. No network:
the wheel downloader and installer are stand-ins, the "GGUF" is a megabyte of random bytes."""

import hashlib
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_kit.py"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


kit = load("device_kit", SCRIPT)
KiB = 1024
LIMIT, MARGIN, OVERHEAD = 400 * KiB, 20 * KiB, 8 * KiB
WHEEL_BYTES = 50_000


def fake_download(calls: list):
    def download(spec: str, folder: Path) -> None:
        name, version = spec.split("==")
        calls.append(spec)
        (folder / f"{name}-{version}-py3-none-any.whl").write_bytes(name.encode() * (WHEEL_BYTES // len(name)))
    return download


@pytest.fixture
def repo(tmp_path):
    """A git repository standing in for the project: 40 KB of untracked files (they travel too)."""
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text(".device-kit/\n")
    (root / "filler.bin").write_bytes(b"x" * 40_000)
    return root


def make_file(path: Path, size: int, seed: int = 0) -> Path:
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def pack_in(repo: Path, gguf: Path, out: str = ".device-kit", downloads: list | None = None):
    questions = repo.parent / "questions.jsonl"
    questions.write_text('{"question_id": 1, "category": "writing", "turns": ["Hi"]}\n' * 50)
    opts = kit.PackOptions(root=repo, out=repo / out, gguf=gguf, questions=questions, limit=LIMIT, margin=MARGIN,
                           overhead=OVERHEAD)
    return kit.pack(opts, download=fake_download(downloads if downloads is not None else []))


@pytest.fixture
def packed(repo):
    gguf = make_file(repo.parent / "model.gguf", 1_000_003)
    manifest, calls, tree = pack_in(repo, gguf)
    return repo, gguf, manifest, calls, tree


def run_main(args: list[str], capsys) -> tuple[int, str]:
    code = kit.main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# -- the plan ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("whole,room,last_room", [
    (98_362_432, 39_624_000, 25_000_000), (1_000_003, 340_000, 200_000), (100, 1000, 50), (100, 1000, 100),
    (10 ** 6, 999, 1), (3000, 1000, 1000), (0, 10, 10),
])
def test_the_split_fits_every_call_and_uses_the_fewest(whole, room, last_room):
    sizes = kit.plan_split(whole, room, last_room)
    assert sum(sizes) == whole
    assert all(0 <= s <= room for s in sizes[:-1]) and 0 <= sizes[-1] <= last_room
    fewer = (len(sizes) - 2) * room + last_room if len(sizes) > 1 else 0
    assert fewer < whole or len(sizes) == 1  # one call less could not hold it
    if len(sizes) > 1 and last_room < room:
        assert sizes[-1] < sizes[0]


def test_the_real_numbers_need_three_calls():
    tree, wheels, questions = 24_312_228, 13_549_890 + 118_475, 698_768  # measured when this was written
    room = 64 * kit.MIB - 3 * kit.MIB - tree - kit.OVERHEAD
    sizes = kit.plan_split(98_362_432, room, room - wheels - questions)
    assert len(sizes) == 3 and sizes[-1] < sizes[0]
    assert tree + sizes[-1] + wheels + questions + kit.OVERHEAD <= 61 * kit.MIB


def test_no_room_is_refused_with_the_fix():
    with pytest.raises(kit.KitError, match="too big"):
        kit.plan_split(1000, 500, 0)


def test_pack_plans_calls_that_fit_with_the_tree_and_the_wheels(packed):
    repo, gguf, manifest, calls, tree = packed
    assert tree == kit.tree_bytes(repo) == 40_000 + len(".device-kit/\n")
    assert manifest.tree_bytes == tree and [c.index for c in calls] == list(range(1, manifest.calls + 1))
    for call in calls:
        folder = repo / call.carry
        on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        assert call.carry_bytes == on_disk and tree + on_disk <= LIMIT - MARGIN
        assert json.loads((folder / "manifest.json").read_text())["file"]["md5"] == manifest.file.md5
    last = repo / calls[-1].carry
    assert sorted(p.name for p in (last / "wheels").iterdir()) == ["gguf-0.19.0-py3-none-any.whl",
                                                                   "transformers-5.24.0-py3-none-any.whl"]
    assert (last / "questions.jsonl").is_file()
    assert manifest.pieces[-1].size < manifest.pieces[0].size
    room = LIMIT - MARGIN - tree - OVERHEAD
    extras = 2 * WHEEL_BYTES + manifest.questions.size
    assert (manifest.calls - 2) * room + room - extras < manifest.file.size  # the fewest calls
    assert sum(p.size for p in manifest.pieces) == gguf.stat().st_size == manifest.file.size
    assert manifest.file.md5 == hashlib.md5(gguf.read_bytes()).hexdigest()


def test_pack_downloads_each_wheel_once(repo):
    gguf, downloads = make_file(repo.parent / "model.gguf", 300_000), []
    pack_in(repo, gguf, downloads=downloads)
    pack_in(repo, gguf, downloads=downloads)
    assert downloads == list(kit.WHEELS)


def test_pack_refuses_a_folder_git_does_not_ignore_and_a_missing_gguf(repo):
    gguf = make_file(repo.parent / "model.gguf", 1000)
    with pytest.raises(kit.KitError, match="add 'kit-elsewhere/' to .gitignore"):
        pack_in(repo, gguf, out="kit-elsewhere")
    with pytest.raises(kit.KitError, match="fetch_smollm2"):
        pack_in(repo, repo / "nowhere.gguf")


def test_every_printed_command_fits_the_tool(packed):
    repo, _, manifest, calls, tree = packed
    text = kit.describe(manifest, calls, tree, "tests")
    commands = [line.split("command: ", 1)[1] for line in text.splitlines() if "command: " in line]
    commands += [line.strip().split("    #")[0] for line in text.splitlines() if "device_job.sh" in line
                 and "command:" not in line]
    assert len(commands) == manifest.calls + 2
    for command in commands:
        assert len(command) <= 2000 and command.startswith("set -euo pipefail;")
    assert calls[-1].command.endswith("assemble; bash scripts/device_job.sh tests")
    assert all(json.loads(line.split("carry: ", 1)[1]) == [f".device-kit/call-{k}"]
               for k, line in enumerate((l for l in text.splitlines() if "carry: " in l), start=1))
    again = kit.commands(repo, repo / ".device-kit", "tests")
    assert again == (manifest, calls, tree)


def test_the_plan_states_the_device_budget_and_warns_of_a_job_over_it(packed, monkeypatch):
    """A task's device time is 15 minutes in all; the plan says so, the job's own time limit is the
    one device_job.sh uses, and a job known to need more is named. The round (25 minutes before
    issue 34) is re-planned to fit: no warning for it."""
    _, _, manifest, calls, tree = packed
    text = kit.describe(manifest, calls, tree, "tests")
    assert kit.DEVICE_BUDGET_S == 15 * 60 and "device time: 15 minutes per task" in text
    assert f"stops itself after {kit.JOB_SECONDS} s" in text and "warning" not in text
    assert f"LIMIT=${{OPTTREE_JOB_SECONDS:-{kit.JOB_SECONDS}}}" in (ROOT / "scripts" / "device_job.sh").read_text()
    assert "warning" not in kit.describe(manifest, calls, tree, "round")
    monkeypatch.setitem(kit.OVER_BUDGET, "bench", "a bench of 30 minutes")  # a job over it is named
    assert "warning: the bench job: a bench of 30 minutes" in kit.describe(manifest, calls, tree, "bench")


def test_pack_for_the_round_carries_its_prompts_to_the_kit(repo, tmp_path):
    gguf = make_file(repo.parent / "model.gguf", 300_000)
    prompts = make_file(tmp_path / "made-here.jsonl.gz", 5_000, seed=3)
    questions = repo.parent / "questions.jsonl"
    questions.write_text('{"question_id": 1, "category": "writing", "turns": ["Hi"]}\n')
    opts = kit.PackOptions(root=repo, out=repo / ".device-kit", gguf=gguf, questions=questions, limit=LIMIT,
                           margin=MARGIN, overhead=OVERHEAD, job="round", prompts=prompts)
    manifest, calls, _ = kit.pack(opts, download=fake_download([]))
    assert manifest.prompts.name == kit.ROUND_PROMPTS and manifest.prompts.size == 5_000
    assert (repo / calls[-1].carry / kit.ROUND_PROMPTS).read_bytes() == prompts.read_bytes()
    assert calls[-1].command.endswith("assemble; bash scripts/device_job.sh round")
    device = tmp_path / "device"
    for k in range(1, manifest.calls + 1):
        kit.receive(k, repo / ".device-kit", device)
    message = kit.assemble(repo / ".device-kit", device, tmp_path / "site", install=lambda w, s: None)
    assert (device / kit.ROUND_PROMPTS).read_bytes() == prompts.read_bytes() and "round prompts" in message
    assert kit.Manifest.read(device / "manifest.json").prompts == manifest.prompts
    # a kit packed for the tests carries none, and its manifest (like an older kit's) reads back
    manifest, _, _ = pack_in(repo, gguf)
    assert manifest.prompts is None and kit.Manifest.read(repo / ".device-kit" / "manifest.json").prompts is None


def test_commands_refuses_a_tree_that_has_grown(packed):
    repo = packed[0]
    (repo / "new.bin").write_bytes(b"y" * 200_000)
    with pytest.raises(kit.KitError, match="run pack again"):
        kit.commands(repo, repo / ".device-kit", "tests")


# -- there: receive and assemble ---------------------------------------------------------------------

def receive_all(repo: Path, manifest, device: Path) -> list[str]:
    return [kit.receive(k, repo / ".device-kit", device) for k in range(1, manifest.calls + 1)]


def test_the_round_trip_gives_back_the_same_bytes_where_opttree_looks(packed, tmp_path, monkeypatch):
    repo, gguf, manifest, _, _ = packed
    device, site, installs = tmp_path / "device", tmp_path / "site", []
    receive_all(repo, manifest, device)
    message = kit.assemble(repo / ".device-kit", device, site, install=lambda w, s: installs.append((w, s)))
    joined = kit.gguf_path(device)
    assert joined.read_bytes() == gguf.read_bytes() and "md5" in message
    assert [w.name for w in installs[0][0]] == [w.name for w in manifest.wheels] and installs[0][1] == site
    assert (device / "questions.jsonl").read_bytes() == (repo.parent / "questions.jsonl").read_bytes()
    assert (device / "assembled.json").is_file()
    smollm2 = load("smollm2_alone", ROOT / "src" / "opttree" / "smollm2.py")  # stdlib only: no torch needed
    monkeypatch.setenv("OPTTREE_CACHE", str(device / "opttree-cache"))
    assert smollm2.GGUF_FILE == kit.GGUF_FILE and smollm2.fetch_smollm2() == joined.parent  # found, not fetched


def test_receive_and_assemble_may_run_again(packed, tmp_path):
    repo, gguf, manifest, _, _ = packed
    device, installs = tmp_path / "device", []
    first = receive_all(repo, manifest, device)
    again = receive_all(repo, manifest, device)
    assert all("received" in m for m in first) and all("already here" in m for m in again)
    for _ in range(2):
        kit.assemble(repo / ".device-kit", device, tmp_path / "site", install=lambda w, s: installs.append(w))
    assert len(installs) == 1 and kit.gguf_path(device).read_bytes() == gguf.read_bytes()


def test_a_missing_piece_is_named_with_exit_code_2(packed, tmp_path, capsys):
    repo, _, manifest, _, _ = packed
    n, device, out = manifest.calls, str(tmp_path / "device"), str(repo / ".device-kit")
    assert run_main(["receive", "1", "--out", out, "--kit", device], capsys)[0] == 0
    code, text = run_main(["receive", "3", "--out", out, "--kit", device], capsys)
    assert code == 2 and f"piece 2 of {n} is missing: the machine went cold" in text and "start again from call 1" in text
    receive_all(repo, manifest, Path(device))
    (Path(device) / "pieces" / "piece-2").unlink()
    code, text = run_main(["assemble", "--out", out, "--kit", device, "--site", str(tmp_path / "site")], capsys)
    assert code == 2 and f"piece 2 of {n} is missing" in text


def test_a_cold_machine_is_named_at_assembly_and_by_the_job(packed, tmp_path, capsys):
    repo = packed[0]
    code, text = run_main(["assemble", "--out", str(repo / ".device-kit"), "--kit", str(tmp_path / "cold")], capsys)
    assert code == 2 and "no piece has been received" in text
    job = subprocess.run(["bash", str(ROOT / "scripts" / "device_job.sh"), "tests"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OPTTREE_KIT": str(tmp_path / "cold"), "OUT": str(tmp_path)})
    assert job.returncode == 2 and "no assembled kit" in job.stderr


def test_a_corrupted_piece_is_refused(packed, tmp_path, capsys):
    repo, _, manifest, _, _ = packed
    device, out = tmp_path / "device", repo / ".device-kit"
    receive_all(repo, manifest, device)
    piece = device / "pieces" / "piece-2"
    data = bytearray(piece.read_bytes())
    data[100] ^= 1
    piece.write_bytes(bytes(data))
    code, text = run_main(["assemble", "--out", str(out), "--kit", str(device)], capsys)
    assert code == 2 and f"piece 2 of {manifest.calls} is corrupted" in text
    assert not kit.gguf_path(device).exists()
    carried = out / "call-1" / "piece-1"  # damaged on the way: refused at receive
    carried.write_bytes(b"\0" + carried.read_bytes()[1:])
    code, text = run_main(["receive", "1", "--out", str(out), "--kit", str(tmp_path / "fresh")], capsys)
    assert code == 2 and "piece 1 of" in text and "arrived with md5" in text


def test_a_manifest_from_another_file_is_refused(packed, tmp_path, capsys):
    repo, _, manifest, _, _ = packed
    device, out = tmp_path / "device", repo / ".device-kit"
    other, _, _ = pack_in(repo, make_file(repo.parent / "other.gguf", 1_000_003, seed=1), out=".device-kit/other")
    assert other.file.md5 != manifest.file.md5 and other.calls == manifest.calls
    kit.receive(1, out, device)
    (out / "call-2" / "manifest.json").write_text((out / "other" / "call-2" / "manifest.json").read_text())
    code, text = run_main(["receive", "2", "--out", str(out), "--kit", str(device)], capsys)
    assert code == 2 and "manifest of another pack" in text and other.file.md5 in text
    assert "received" in kit.receive(1, out / "other", device)  # call 1 of a new pack starts afresh
    assert sorted(p.name for p in (device / "pieces").iterdir()) == ["piece-1"]


def test_the_script_runs_on_its_own(packed, tmp_path):
    repo = packed[0]
    result = subprocess.run([sys.executable, "-I", str(SCRIPT), "receive", "2", "--out", str(repo / ".device-kit"),
                             "--kit", str(tmp_path / "device")], capture_output=True, text=True)
    assert result.returncode == 2 and "device_kit.py receive: error: piece 1 of" in result.stderr


FAKE_PYTHON = r"""#!/usr/bin/env bash
# stands in for the device's python3: notes its arguments, makes what the real command would
echo "$*" >> "$OPTTREE_KIT/calls.txt"
case "$*" in
  *"import matplotlib"*) exit 1 ;;
  *"import sys, torch"*) echo "python 3.12 | torch 2.11 | transformers 5.24.0" ;;
  *opttree.bench*) out=""; prev=""; for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
    mkdir -p "$out/answers"; echo "| method | speed |" > "$out/summary.md"; echo "{}" > "$out/answers/plain.jsonl" ;;
  *"opttree.distill.recipes.resident"*"round-gpu-eagle3.toml"*) mkdir -p "$OPTTREE_KIT/head-next"
    for f in config.json training.json round.json; do echo "$f" > "$OPTTREE_KIT/head-next/$f"; done
    head -c $((20 * 1024 * 1024)) /dev/urandom > "$OPTTREE_KIT/head-next/model.safetensors" ;;  # over 16 MiB
  *"opttree.distill.recipes.resident"*) mkdir -p "$OPTTREE_KIT/head-next"
    for f in model.safetensors opttree_draft.json training.json round.json; do
      echo "$f" > "$OPTTREE_KIT/head-next/$f"; done ;;
  *pytest*) echo "1 passed" ;;
esac
"""


@pytest.mark.parametrize("job,comes_back", [
    ("tests", ["tests.log"]),
    ("bench", ["bench-summary.md", "bench.log", "bench.tar.gz"]),
    ("round", ["head-next.tar.gz", "model.safetensors.part00", "model.safetensors.part01", "round.log"]),
    ("round head", ["head-next.tar.gz", "round.log"]),
])
def test_each_job_runs_its_command_and_sends_back_few_files(tmp_path, job, comes_back):
    device, out, bin_dir = tmp_path / "kit", tmp_path / "out", tmp_path / "bin"
    device.mkdir(), bin_dir.mkdir()
    (device / "assembled.json").write_text("{}")
    (device / "spec_bench_questions.jsonl").write_text("{}\n")
    (device / "round-prompts.jsonl.gz").write_bytes(b"")
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OPTTREE_KIT": str(device), "OUT": str(out)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "device_job.sh"), *job.split()], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == comes_back
    calls = (device / "calls.txt").read_text()
    if job == "tests":
        assert "-m pytest -q -m gpu --ignore=tests/test_bench.py" in calls and "-m real_model and not gpu" in calls
    if job == "bench":  # the stand-in at a 7 B's cost first, then SmolLM2 itself; HF's compiled peers beside opttree
        assert f"--questions {device}/spec_bench_questions.jsonl" in calls and "--no-plots" in calls
        assert "--categories writing,roleplay,reasoning,math,coding,extraction,stem,humanities,translation," in calls
        runs = [line for line in calls.splitlines() if "opttree.bench" in line]
        assert [r.split("--target ")[1].split()[0] for r in runs] == ["smollm2:7b", "smollm2"]
        assert all("--methods plain,plain-compiled,assisted,assisted-compiled,opttree " in r for r in runs)
        assert all("--opttree nodes=16,compiled=1 --opttree nodes=32,compiled=1" in r for r in runs)
        assert (out / "bench-summary.md").read_text().count("| method | speed |") == 2
    if job.startswith("round"):  # issue 34: one call, everything in memory, the kit's prompts, a clock of its own
        recipe = "round-gpu.toml" if job == "round head" else "round-gpu-eagle3.toml"  # issue 51.c: EAGLE-3 first
        assert (f"-m opttree.distill.recipes.resident --recipe drafts/smollm2-135m-head/{recipe} "
                f"--prompts {device}/round-prompts.jsonl.gz --out {device}/head-next --device cuda --seconds ") in calls
        listed = subprocess.run(["tar", "-tzf", str(out / "head-next.tar.gz")], capture_output=True, text=True).stdout
        assert "head-next/round.json" in listed and "head-next/training.json" in listed
    if job == "round head":
        assert "head-next/model.safetensors" in listed and "head-next/opttree_draft.json" in listed
    if job == "round":  # the EAGLE-3 folder's 20 MiB of weights come back in two pieces that join to the same bytes
        assert "head-next/config.json" in listed and "head-next/model.safetensors" not in listed
        joined = b"".join((out / f"model.safetensors.part0{i}").read_bytes() for i in (0, 1))
        assert joined == (device / "head-next" / "model.safetensors").read_bytes()
        assert hashlib.sha256(joined).hexdigest() in (out / "round.log").read_text()


def test_the_round_job_refuses_a_kit_without_its_prompts(tmp_path):
    device, out = tmp_path / "kit", tmp_path / "out"
    device.mkdir()
    (device / "assembled.json").write_text("{}")
    env = {"PATH": "/usr/bin:/bin", "OPTTREE_KIT": str(device), "OUT": str(out)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "device_job.sh"), "round"], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 2 and "pack --job round" in result.stderr
    (device / "round-prompts.jsonl.gz").write_bytes(b"")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "device_job.sh"), "round", "eagle2"], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 2 and "round [eagle3|head]: no round 'eagle2'" in result.stderr


def test_both_rounds_answer_the_prompts_the_kit_carries():
    """The kit writes its prompts from round-gpu.toml; the EAGLE-3 round reads the same file, so its
    recipe must draw the same prompts: the same seed and answers source (what round_prompts reads)."""
    from opttree.distill.recipes.recipe import load_recipe
    from opttree.distill.recipes.resident import round_source

    head = load_recipe(ROOT / "drafts/smollm2-135m-head/round-gpu.toml")
    eagle3 = load_recipe(ROOT / "drafts/smollm2-135m-head/round-gpu-eagle3.toml")
    assert eagle3.kind == "eagle3" and head.kind == "head"
    assert (eagle3.seed, round_source(eagle3), eagle3.base) == (head.seed, round_source(head), head.base)


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.one_end  # the kit carries transformers 5.24.0 (WHEELS): the newest end's
def test_the_bench_job_runs_end_to_end_on_the_cpu(tmp_path):
    """The GPU bench job as it runs there, on this CPU: the real SmolLM2 inflated (a small stand-in
    size), every method of the job with compile forced on the CPU (dynamo's eager backend: the same
    graphs traced), 2 prompts of 4 tokens. Its files come back, its summary has every method, and
    every output equals plain."""
    from opttree.hf.compat import assisted_takes_static_cache
    from opttree.smollm2 import CONVERTED, cache_dir, converted_smollm2

    converted_smollm2()  # the GGUF and its plain folder (tests/test_smollm2_cache.py), linked into the kit's cache
    device, out, bin_dir = tmp_path / "kit", tmp_path / "out", tmp_path / "bin"
    (device / "opttree-cache").mkdir(parents=True), bin_dir.mkdir()
    (device / "assembled.json").write_text("{}")
    for name in ("smollm2", CONVERTED):
        (device / "opttree-cache" / name).symlink_to(cache_dir() / name)
    (device / "spec_bench_questions.jsonl").write_text((ROOT / "tests" / "data" / "prompts.jsonl").read_text())
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's python
    (bin_dir / "python3").chmod(0o755)
    size = "hidden_size=768,intermediate_size=1600,num_attention_heads=12,num_key_value_heads=4,num_hidden_layers=31"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OPTTREE_KIT": str(device), "OUT": str(out), "HOME": str(tmp_path),
           "OPTTREE_BENCH_TARGETS": f"smollm2:{size}", "OPTTREE_BENCH_DEVICE": "cpu", "OPTTREE_BENCH_DTYPE": "float32",
           "OPTTREE_BENCH_EXTRA": "--compile-backend eager --max-new-tokens 4 --categories writing,math --threads 1",
           "OPTTREE_CALIBRATION": "off"}
    methods = ["plain", "plain-compiled", "assisted", "assisted-compiled", "opttree"]
    if not assisted_takes_static_cache():  # an older transformers' assisted generation refuses a static cache
        methods.remove("assisted-compiled")
        env["OPTTREE_BENCH_METHODS"] = ",".join(methods)
    result = subprocess.run(["bash", str(ROOT / "scripts" / "device_job.sh"), "bench"], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["bench-summary.md", "bench.log", "bench.tar.gz"]
    summary = (out / "bench-summary.md").read_text()
    for method in (*methods, "opttree-compiled(nodes=16)", "opttree-compiled(nodes=32)"):
        assert f"| `{method}` |" in summary, method
    assert "FAILED" not in summary and "0 graphs compiled while timed" in summary
