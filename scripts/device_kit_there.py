"""The device's side of ``device_kit.py``: the manifest, and the steps the printed calls run there.

``receive K`` copies call K's piece into ``/tmp/opttree-kit/pieces`` (outside the tree copy, so it
outlives the call while the machine stays warm); ``assemble`` joins the pieces where
``opttree.smollm2`` looks for the GGUF (``$OPTTREE_CACHE/smollm2`` with
``OPTTREE_CACHE=/tmp/opttree-kit/opttree-cache``), checks each piece and the whole by md5, installs
the wheels into ``/tmp/site`` and places Spec-Bench's questions (and, for the round, its prompts)
in the kit. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 1 << 20
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # opttree.smollm2.GGUF_FILE, found in $OPTTREE_CACHE/smollm2
KIT = Path(os.environ.get("OPTTREE_KIT", "/tmp/opttree-kit"))  # on the device, outside the tree copy
SITE = Path(os.environ.get("OPTTREE_SITE", "/tmp/site"))
RESTART = "start again from call 1"


class KitError(Exception):
    """A problem with the kit; its message names the fix (exit code 2)."""


@dataclass(frozen=True)
class Item:
    """A file the manifest vouches for."""
    name: str
    size: int
    md5: str


@dataclass(frozen=True)
class Manifest:
    """What pack wrote: the GGUF, its pieces in order (piece K rides in call K), the last call's extras."""
    file: Item
    pieces: tuple[Item, ...]
    wheels: tuple[Item, ...]
    questions: Item | None
    tree_bytes: int
    limit: int
    margin: int
    prompts: Item | None = None  # the round's prompts (pack --job round), made where the documents are

    @property
    def calls(self) -> int:
        return len(self.pieces)

    def same_pack(self, other: Manifest) -> bool:
        return (self.file, self.pieces) == (other.file, other.pieces)

    def to_json(self) -> str:
        return json.dumps({"kit": 1, **asdict(self)}, indent=2) + "\n"

    @staticmethod
    def read(path: Path) -> Manifest:
        try:
            raw = json.loads(path.read_text())
            item = lambda d: Item(**d) if d else None  # noqa: E731
            return Manifest(item(raw["file"]), tuple(map(item, raw["pieces"])), tuple(map(item, raw["wheels"])),
                            item(raw["questions"]), raw["tree_bytes"], raw["limit"], raw["margin"],
                            item(raw.get("prompts")))
        except (ValueError, KeyError, TypeError) as error:
            raise KitError(f"{path} is no device kit manifest ({error!r}): run pack again") from None


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            digest.update(chunk)
    return digest.hexdigest()


def item_of(path: Path) -> Item:
    return Item(path.name, path.stat().st_size, md5_of(path))


def copy_checked(src: Path, dest: Path, want: Item, what: str) -> None:
    """Copy ``src`` to ``dest`` (via a .tmp file) and check it against ``want``."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copyfile(src, tmp)
    got = md5_of(tmp)
    if got != want.md5:
        tmp.unlink()
        raise KitError(f"{what} arrived with md5 {got}, the manifest says {want.md5}: run pack again, then {RESTART}")
    tmp.rename(dest)


def pip_install(wheels: list[Path], site: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *map(str, wheels)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise KitError(f"installing the wheels failed ({result.stderr.strip()[-400:]}): {' '.join(cmd)}")


def missing_piece(k: int, n: int) -> KitError:
    return KitError(f"piece {k} of {n} is missing: the machine went cold between calls (they must follow each "
                    f"other within 30 s) or call {k} was skipped; {RESTART}")


def carried_manifest(out: Path, k: int) -> Manifest:
    path = out / f"call-{k}" / "manifest.json"
    if not path.is_file():
        raise KitError(f"{path} is not here: call {k} must carry [\"{out}/call-{k}\"] (see `device_kit.py commands`)")
    return Manifest.read(path)


def receive(k: int, out: Path, kit: Path = KIT) -> str:
    """Call K: copy piece K into ``kit/pieces`` and check it; pieces 1..K-1 must already be there."""
    manifest = carried_manifest(out, k)
    n = manifest.calls
    if not 1 <= k <= n:
        raise KitError(f"there is no call {k}: the manifest plans {n}")
    held_path = kit / "manifest.json"
    note = ""
    if held_path.is_file() and not Manifest.read(held_path).same_pack(manifest):
        if k != 1:
            raise KitError(f"call {k} carries the manifest of another pack (file md5 {manifest.file.md5}) than the "
                           f"pieces received here ({Manifest.read(held_path).file.md5}); {RESTART}")
        shutil.rmtree(kit / "pieces", ignore_errors=True)  # call 1 of a new pack: an older pack's pieces go
        (kit / "assembled.json").unlink(missing_ok=True)
        note = " (the pieces of an older pack were dropped)"
    (kit / "pieces").mkdir(parents=True, exist_ok=True)
    held_path.write_text(manifest.to_json())
    for j, piece in enumerate(manifest.pieces[:k - 1], start=1):
        path = kit / "pieces" / piece.name
        if not path.is_file() or path.stat().st_size != piece.size:
            raise missing_piece(j, n)
    want, dest = manifest.pieces[k - 1], kit / "pieces" / manifest.pieces[k - 1].name
    if dest.is_file() and dest.stat().st_size == want.size and md5_of(dest) == want.md5:
        return f"piece {k} of {n} was already here (md5 ok){note}"
    src = out / f"call-{k}" / want.name
    if not src.is_file():
        raise KitError(f"{src} is missing from call {k}'s folder: run pack again, then {RESTART}")
    copy_checked(src, dest, want, f"piece {k} of {n}")
    return f"piece {k} of {n} received: {want.size} bytes, md5 ok{note}"


def gguf_path(kit: Path = KIT) -> Path:
    """Where assemble puts the GGUF: ``$OPTTREE_CACHE/smollm2/`` with ``OPTTREE_CACHE=kit/opttree-cache``."""
    return kit / "opttree-cache" / "smollm2" / GGUF_FILE


def join_pieces(manifest: Manifest, kit: Path) -> None:
    n, dest = manifest.calls, gguf_path(kit)
    for k, piece in enumerate(manifest.pieces, start=1):
        path = kit / "pieces" / piece.name
        if not path.is_file():
            raise missing_piece(k, n)
        got = Item(piece.name, path.stat().st_size, md5_of(path))
        if got != piece:
            raise KitError(f"piece {k} of {n} is corrupted (size {got.size}, md5 {got.md5}; the manifest says "
                           f"{piece.size}, {piece.md5}); {RESTART}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with open(tmp, "wb") as f:
        for piece in manifest.pieces:
            with open(kit / "pieces" / piece.name, "rb") as src:
                shutil.copyfileobj(src, f, MIB)
    if (got := md5_of(tmp)) != manifest.file.md5:
        tmp.unlink()
        raise KitError(f"the joined {manifest.file.name} has md5 {got}, the manifest says {manifest.file.md5}; {RESTART}")
    tmp.rename(dest)


def assemble(out: Path, kit: Path = KIT, site: Path = SITE, install=pip_install) -> str:
    """Last call: join the pieces and check the whole; install the wheels; place the questions."""
    if not (kit / "manifest.json").is_file():
        raise KitError(f"no piece has been received in {kit} (the machine went cold?); {RESTART}")
    held = Manifest.read(kit / "manifest.json")
    last = out / f"call-{held.calls}"
    if not carried_manifest(out, held.calls).same_pack(held):
        raise KitError(f"{last} belongs to another pack than the pieces received in {kit}; {RESTART}")
    dest = gguf_path(kit)
    if not (dest.is_file() and dest.stat().st_size == held.file.size and md5_of(dest) == held.file.md5):
        join_pieces(held, kit)
    wheels = []
    for wheel in held.wheels:
        path = last / "wheels" / wheel.name
        if not path.is_file() or md5_of(path) != wheel.md5:
            raise KitError(f"{path} is missing or not the wheel pack made (md5 {wheel.md5}): run pack again")
        wheels.append(path)
    stamp, want = site / ".opttree-kit.json", json.dumps(sorted(w.md5 for w in held.wheels))
    if not (stamp.is_file() and stamp.read_text() == want):
        install(wheels, site)
        site.mkdir(parents=True, exist_ok=True)
        stamp.write_text(want)
    for extra in (held.questions, held.prompts):
        if extra is None:
            continue
        path, there = last / extra.name, kit / extra.name
        if not (there.is_file() and md5_of(there) == extra.md5):
            if not path.is_file():
                raise KitError(f"{path} is missing from the last call's folder: run pack again")
            copy_checked(path, there, extra, extra.name)
    (kit / "assembled.json").write_text(held.to_json())
    return (f"assembled: {dest} (md5 {held.file.md5} ok); wheels in {site}: "
            f"{', '.join(w.name for w in held.wheels)}; questions: {kit / held.questions.name if held.questions else 'none'}"
            + (f"; round prompts: {kit / held.prompts.name}" if held.prompts else ""))
