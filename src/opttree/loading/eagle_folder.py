"""A published EAGLE head's folder read (:func:`load_eagle`): ``config.json`` and ``model.safetensors``
(or ``pytorch_model.bin``, read with ``torch.load(weights_only=True)``: nothing runs) -> the head
completed from the target. Which head is the registry's (:mod:`.eagle`, by config.json's
``architectures``); its class reads the config, maps the weights' names and builds the head. What
every layout is checked for alike (the target fits, ``d2t``'s columns, each key of its shape) is here.

Rules and sources: DESIGN.md, "EAGLE heads". Everything that does not fit is a ValueError that names
the file, the key or the field, and the fix.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import torch

from ..drafters.head.eagle import EagleConfig
from ..hf.width import text_config
from .eagle import PublishedHead, head_class
from .eagle.fields import CONFIG_FILE
from .pickled import read_pickled

SAFETENSORS = "model.safetensors"
PICKLED = "pytorch_model.bin"


def is_eagle_folder(path: Path) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` (read here, not by the opttree formats)."""
    return (path / CONFIG_FILE).is_file()


def is_eagle_head(path: Path) -> bool:
    """Whether ``path`` is a folder of a head this module reads (its config.json names a registered
    layout whose weights fit, :func:`~.eagle.head_class`); False for any other folder."""
    if not is_eagle_folder(path):
        return False
    try:
        head_class(read_config(path), path, lambda: weight_names(path))
    except ValueError:
        return False
    return True


def weight_names(path: Path) -> dict:
    """The weights' names (values None) read from the safetensors header alone, else the whole pickle."""
    if (path / SAFETENSORS).is_file():
        from safetensors import safe_open

        with safe_open(str(path / SAFETENSORS), framework="pt") as f:
            return dict.fromkeys(f.keys())
    return read_state(path)


def read_config(path: Path) -> dict:
    """The JSON object in ``path``'s config.json; ValueError naming the file otherwise."""
    file = path / CONFIG_FILE
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ValueError(f"{file} is missing: {path} is not an EAGLE head's folder") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"could not read {file} as JSON ({error}); restore the head's config.json") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object; restore the head's config.json")
    return data


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The head's tensors: model.safetensors, else pytorch_model.bin (:func:`.pickled.read_pickled`: through
    ``torch.load(weights_only=True)``, a file of another kind, or a pickle of more than tensors, refused by name)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if (path / SAFETENSORS).is_file():
        try:
            return load_file(str(path / SAFETENSORS))
        except (OSError, SafetensorError) as error:
            raise ValueError(f"could not read {path / SAFETENSORS} ({error}); restore the head's weights") from None
    if not (path / PICKLED).is_file():
        raise ValueError(f"{path} holds neither {SAFETENSORS} nor {PICKLED}: an EAGLE head's folder needs its weights")
    return read_pickled(path / PICKLED)


def stored_dtype(state: dict[str, torch.Tensor]) -> str:
    """The one floating dtype of a folder's tensors ("float16", ...); "" where they mix dtypes."""
    kinds = {str(v.dtype).removeprefix("torch.") for v in state.values() if v.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 else ""


def check_target(c: EagleConfig, target, path: Path) -> None:
    """The target's hidden size and vocabulary must be the head's (its layer count fits its taps,
    :func:`~.layer_ids.tap_ids`, and an export's record of it); an EAGLE-3 head on the target's
    embedding needs h == H."""
    tc = text_config(target.config)
    if (tc.hidden_size, tc.vocab_size) != (c.target_hidden_size, c.vocab_size):
        raise ValueError(f"{path} is an EAGLE head for a target with hidden size {c.target_hidden_size} and vocabulary "
                         f"{c.vocab_size}; this target has {tc.hidden_size} and {tc.vocab_size}: pass the target it was "
                         "trained for")
    if not c.own_embedding and c.hidden_size != tc.hidden_size:
        raise ValueError(f"{path}: the head's hidden size {c.hidden_size} differs from the target's {tc.hidden_size} and "
                         "the folder has no embed_tokens.weight of its own; restore the head's embedding")


def check_state(head: PublishedHead, state: dict[str, torch.Tensor], path: Path) -> None:
    """Every key the head has, of its shape, and no other; ValueError naming the key (and both shapes)."""
    expected = head.state_dict()
    optional = {"d2t"} if head.c.draft_vocab_size == head.c.vocab_size else set()
    missing = sorted(set(expected) - set(state) - optional)
    if missing:
        raise ValueError(f"{path}: the head's weights lack {missing[0]!r}" + (f" (and {len(missing) - 1} more)"
                         if len(missing) > 1 else "") + "; restore the head's weights")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} in the head's weights (a {head.kind} head of this "
                         "config.json has none such); check the config.json matches the weights")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(f"{path}: {key!r} has shape {list(value.shape)}, but the head its config.json describes "
                             f"needs {list(expected[key].shape)}; restore the matching config.json or weights")


def check_columns(c: EagleConfig, d2t: torch.Tensor, path: Path) -> None:
    """``d2t`` is an offset: target id = draft id + d2t[draft id], each in the vocabulary, all distinct."""
    ids = torch.arange(c.draft_vocab_size) + d2t.long()
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size or len(torch.unique(ids)) != len(ids):
        raise ValueError(f"{path}: 'd2t' must map each draft id j to a distinct target id j + d2t[j] in "
                         f"[0, {c.vocab_size}); restore the head's weights")


def load_eagle(path: str | Path, target) -> PublishedHead:
    """The EAGLE head in folder ``path`` completed from ``target`` (its embedding, and EAGLE-1's output
    rows), eval, float32, on the device of the target's input embedding. Its class is the registry's
    (:func:`~.eagle.head_class`); the class reads the config, maps the weights' names and builds the head."""
    path = Path(path)
    raw = read_config(path)
    weights = functools.cache(lambda: read_state(path))
    cls = head_class(raw, path, weights)  # an unknown architecture is refused before any weight is read
    state = weights()
    c = replace(cls.read_config(raw, state, target, path), stored_dtype=stored_dtype(state))
    check_target(c, target, path)
    state = cls.key_map(state)
    if "d2t" in state:
        if tuple(state["d2t"].shape) != (c.draft_vocab_size,):
            raise ValueError(f"{path}: 'd2t' has shape {list(state['d2t'].shape)}, but the head its config.json "
                             f"describes needs [{c.draft_vocab_size}]; restore the matching config.json or weights")
        check_columns(c, state["d2t"], path)
    head = cls.from_target(c, target, state.get("d2t"))
    check_state(head, state, path)
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=False)
    return head.to(target.get_input_embeddings().weight.device).eval()


__all__ = ["CONFIG_FILE", "is_eagle_folder", "is_eagle_head", "load_eagle", "read_config", "read_state"]
