"""A Llama-family model made wider and deeper without changing what it computes: a cost stand-in.

``inflate(model, "7b")`` returns a model with the cost of a bigger one (its weights' memory stream
and its arithmetic) that writes the same text as ``model``, up to rounding. It is not a better
model: the new weights are zeros. It lets a speculative decoder be measured at the step cost of the
targets users run, with the acceptance of a real draft/target pair.

How (every step keeps the function exact):

- the hidden size h grows to H by zero columns: embeddings, and every projection that reads the
  residual stream, see zeros in the new entries and write zeros there;
- each RMSNorm still sees the mean square of the h real entries: its weight times sqrt(h/H), its
  eps times h/H (the mean over H entries is h/H times the mean over h);
- the head size is kept; query head i of key/value group g goes to slot (i mod r) of group g, where
  the new model has R >= r query heads per group, so it still reads its own keys and values; the
  new heads, MLP units and layers have zero output projections (``o_proj``, ``down_proj``), so
  they add nothing to the residual stream;
- source layer i is layer i of the inflated model, the added layers come after them
  (:func:`layer_places`: what an EAGLE-3 head's taps follow, :mod:`.inflate_head`).

The config records the source's shape (:data:`INFLATED_FROM`) and the width that carries its function
(:data:`opttree.hf.width.CARRIED_WIDTH`, a field any target may carry), so drafts made for the source
work against the inflated model unchanged: decoding sees an ordinary target.
The model is built directly on ``device`` in ``dtype`` (on the meta device first, then filled), so
a 6 B stand-in never exists in float32 on the way; a size whose weights do not fit the device's
free memory is refused before anything is allocated. :mod:`.standin` writes a stand-in as a plain
Hugging Face folder (``python -m opttree.bench.standin --size 1b --out DIR``), and its EAGLE-3 head.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import torch

from ..hf.width import CARRIED_WIDTH, text_config

INFLATED_FROM = "opttree_inflated_from"  # the config attribute: the source's shape (a dict of its config fields)


@dataclass(frozen=True)
class Shape:
    """A Llama-family model's shape (the fields of its config that inflation changes)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int


# Named sizes: the cost of the targets users run, with SmolLM2's head size (64).
SIZES = {
    "1b": Shape(2048, 5632, 32, 8, 30),  # 1.35 B parameters with SmolLM2's vocabulary (TinyLlama-1.1B's widths)
    "7b": Shape(4096, 11008, 64, 16, 32),  # 5.87 B: Llama-2-7B's widths and depth, 4 query heads per key/value head
}
LLAMA_TYPES = ("llama", "mistral", "qwen2")  # decoder layers of this exact form: RMSNorm, q/k/v/o, gate/up/down
PARTS = ("embed_tokens.weight", "lm_head.weight", "norm.weight", "layernorm.weight", "q_proj.weight", "q_proj.bias",
         "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias", "o_proj.weight", "o_proj.bias",
         "gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias", "down_proj.weight", "down_proj.bias")


def shape_of(config) -> Shape:
    c = text_config(config)
    return Shape(c.hidden_size, c.intermediate_size, c.num_attention_heads,
                 c.num_key_value_heads or c.num_attention_heads, c.num_hidden_layers)


def head_dim(config) -> int:
    c = text_config(config)
    return int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)


def parse_size(size: str | Shape) -> Shape:
    """``"1b"``, ``"7b"``, ``"hidden_size=2048,intermediate_size=5632,num_attention_heads=32,
    num_key_value_heads=8,num_hidden_layers=30"`` (or a :class:`Shape`) -> a Shape."""
    if isinstance(size, Shape):
        return size
    if size in SIZES:
        return SIZES[size]
    fields = {}
    for part in filter(None, (p.strip() for p in str(size).split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in Shape.__dataclass_fields__ or not value.strip().isdigit():
            fields = None
            break
        fields[key.strip()] = int(value)
    if not fields or set(fields) != set(Shape.__dataclass_fields__):
        raise ValueError(f"size {size!r}: name one of {', '.join(SIZES)}, or give every field as "
                         f"{','.join(f'{k}=N' for k in Shape.__dataclass_fields__)}")
    return Shape(**fields)


def check_llama_shaped(model) -> None:
    """``model`` must be a Llama-family causal LM whose every weight inflation knows how to widen."""
    config = text_config(model.config)
    if getattr(config, "model_type", None) not in LLAMA_TYPES:
        raise ValueError(f"inflate() takes a Llama-family causal LM ({', '.join(LLAMA_TYPES)}); this is a "
                         f"{getattr(config, 'model_type', type(model).__name__)!r} model")
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    if not norms:
        raise ValueError(f"inflate() needs RMSNorm layers (it rescales them); {type(model).__name__} has none")
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(config, "sliding_window", None):
        raise ValueError(f"inflate() takes models of full attention only; this one has {sorted(layer_types)} "
                         f"layers (sliding_window={getattr(config, 'sliding_window', None)})")
    unknown = [n for n, _ in model.named_parameters() if not n.endswith(PARTS)]
    if unknown:
        raise ValueError(f"inflate() does not know how to widen {unknown[0]} ({len(unknown)} such weights): it takes "
                         "the Llama layout (embed_tokens, RMSNorm, q/k/v/o_proj, gate/up/down_proj, lm_head)")


def check_bigger(source: Shape, shape: Shape) -> None:
    """Every dimension at least the source's, and key/value groups that hold the source's query heads."""
    small = [f"{k} {getattr(shape, k)} < {getattr(source, k)}" for k in Shape.__dataclass_fields__
             if getattr(shape, k) < getattr(source, k)]
    if small:
        raise ValueError(f"inflate() makes a model bigger, not smaller: {'; '.join(small)} (the source's)")
    if shape.hidden_size % shape.num_attention_heads:  # transformers' configs refuse it
        raise ValueError(f"hidden_size {shape.hidden_size} must be a multiple of num_attention_heads "
                         f"{shape.num_attention_heads}")
    if shape.num_attention_heads % shape.num_key_value_heads:
        raise ValueError(f"num_attention_heads {shape.num_attention_heads} must be a multiple of "
                         f"num_key_value_heads {shape.num_key_value_heads}")
    need = source.num_attention_heads // source.num_key_value_heads
    have = shape.num_attention_heads // shape.num_key_value_heads
    if have < need:
        raise ValueError(f"{shape.num_attention_heads} query heads over {shape.num_key_value_heads} key/value heads "
                         f"is {have} per group; the source's groups hold {need}: give at least "
                         f"{need * shape.num_key_value_heads} query heads, or fewer key/value heads")


def inflated_config(config, shape: Shape):
    """The inflated model's config: ``config`` with ``shape``, the source's head size, the norms' eps
    scaled, and the source's shape recorded. Its per-layer ``layer_types`` are not the source's list
    (one entry per source layer) but derived again by the config for the new depth, by its family's
    own rule, then checked by :func:`check_layer_types`."""
    c = text_config(config)
    source = shape_of(c)
    fields = {**c.to_dict(), **asdict(shape), "head_dim": head_dim(c),
              "rms_norm_eps": c.rms_norm_eps * source.hidden_size / shape.hidden_size,
              INFLATED_FROM: {**asdict(source), "rms_norm_eps": c.rms_norm_eps}}
    fields.pop("quantization_config", None)  # the stand-in is a dense model in the dtype asked
    fields.pop("layer_types", None)  # one entry per source layer: the config derives the new depth's
    inflated = type(c)(**fields)
    check_layer_types(c, inflated)
    return inflated


def check_layer_types(source, inflated) -> None:
    """The inflated config's layer types are the source's, then full attention for each added layer
    (inflate() takes full-attention models only: an added layer of another kind would change the cost,
    and the masks opttree builds). Configs without ``layer_types`` pass."""
    before = getattr(source, "layer_types", None)
    if before is None:
        return
    after = list(getattr(inflated, "layer_types", None) or [])
    want = list(before) + ["full_attention"] * (inflated.num_hidden_layers - len(before))
    if after != want:
        raise ValueError(f"inflate() cannot give this {source.model_type} model {inflated.num_hidden_layers} layers: "
                         f"its config derives layer_types {after}, not the source's {list(before)} then full attention")


def parameter_bytes(config, dtype: torch.dtype, model_class) -> int:
    """Bytes of the weights of ``model_class(config)`` in ``dtype`` (counted on the meta device)."""
    with torch.device("meta"):
        model = model_class(config)
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total * torch.finfo(dtype).bits // 8


def free_bytes(device: torch.device) -> int:
    """Memory free on ``device``: the GPU's (torch.cuda.mem_get_info), the CPU's available pages."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        available = meminfo_available()
        if available is not None:
            return available
        if hasattr(os, "sysconf"):  # free pages only: the page cache, which the kernel gives back, not counted
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return 1 << 62  # no way to ask: let the allocator say


def meminfo_available(path: str = "/proc/meminfo") -> int | None:
    """Linux's MemAvailable in bytes (free pages plus the page cache the kernel can give back), or None
    where there is no such file. Not ``SC_AVPHYS_PAGES``: that counts free pages only, and after a large
    read (a pip install, a GGUF file) a machine with 22 GiB available showed 0.4 GiB free."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def layer_places(source_layers: int, layers: int) -> tuple[int, ...]:
    """Where :func:`inflate` puts each of the source's ``source_layers`` decoder layers among the
    inflated model's ``layers``: source layer i is inflated layer i, the added zero layers follow
    (they leave the residual stream as it is). So the state entering source layer i (its
    ``output_hidden_states[i]``) is the inflated model's ``output_hidden_states[layer_places(...)[i]]``
    in the first entries; an EAGLE-3 head's taps follow it (:mod:`.inflate_head`). ``layers`` >= the
    source's (:func:`check_bigger`)."""
    return tuple(range(source_layers))


def _placed_name(name: str, places: tuple[int, ...]) -> str:
    """A source parameter's name in the inflated model: ``model.layers.{i}.*`` -> ``model.layers.{places[i]}.*``."""
    head, sep, tail = name.partition(".layers.")
    index, dot, rest = tail.partition(".")
    if not sep or not dot or not index.isdigit():
        return name
    return f"{head}.layers.{places[int(index)]}.{rest}"


def _place_heads(source: Shape, shape: Shape) -> list[int]:
    """The new index of each source query head: head i of group g at slot (i mod r) of group g."""
    r = source.num_attention_heads // source.num_key_value_heads
    big = shape.num_attention_heads // shape.num_key_value_heads
    return [(i // r) * big + i % r for i in range(source.num_attention_heads)]


def _rows_of(heads: list[int], d: int) -> torch.Tensor:
    """The rows (or columns) [len(heads) * d] of those heads in a head-major projection."""
    return torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])


def _slots(name: str, source: Shape, shape: Shape, d: int) -> tuple:
    """Where the source's weight ``name`` [out, in] goes in the inflated one: (rows, columns), each a
    slice or an index tensor; a bias [out] takes the rows."""
    h, i = source.hidden_size, source.intermediate_size
    heads = _rows_of(_place_heads(source, shape), d)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return slice(None), slice(0, h)
    if ".q_proj." in name:
        return heads, slice(0, h)
    if ".k_proj." in name or ".v_proj." in name:
        return slice(0, source.num_key_value_heads * d), slice(0, h)
    if ".o_proj." in name:
        return slice(0, h), heads
    if ".gate_proj." in name or ".up_proj." in name:
        return slice(0, i), slice(0, h)
    if ".down_proj." in name:
        return slice(0, h), slice(0, i)
    raise AssertionError(f"no rule for {name}")  # check_llama_shaped refused it before


def _fill(dst: torch.Tensor, src: torch.Tensor, name: str, source: Shape, shape: Shape, d: int) -> None:
    """``dst`` (the inflated weight, zeroed) takes ``src`` (the source's) where it belongs."""
    h = source.hidden_size
    if name.endswith("norm.weight"):  # [h] -> [H]: the mean square over H entries is h/H of that over h
        dst[:h] = src.double().mul(math.sqrt(h / shape.hidden_size)).to(dst.dtype)
        return
    rows, cols = _slots(name, source, shape, d)
    rows = rows.to(dst.device) if isinstance(rows, torch.Tensor) else rows
    cols = cols.to(dst.device) if isinstance(cols, torch.Tensor) else cols
    if src.dim() == 1:
        dst[rows] = src.to(dst)
    else:
        dst[rows, cols] = src.to(dst)


@torch.no_grad()
def inflate(model, size: str | Shape, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None):
    """``model`` (a Llama-family causal LM) inflated to ``size`` (a name of :data:`SIZES` or a
    :class:`Shape`), in ``dtype`` (default: the model's) on ``device`` (default: the model's):
    the same function at the cost of the bigger shape. ``model`` is left as it is."""
    check_llama_shaped(model)
    source, shape = shape_of(model.config), parse_size(size)
    check_bigger(source, shape)
    param = next(model.parameters())
    dtype = dtype or param.dtype
    device = torch.device(device) if device is not None else param.device
    config = inflated_config(model.config, shape)
    need = parameter_bytes(config, dtype, type(model))
    free = free_bytes(device)
    if need > free:
        raise MemoryError(f"inflating to {shape} needs {need / 2**30:.1f} GiB of weights in {dtype} on {device}; "
                          f"{free / 2**30:.1f} GiB are free: pick a smaller size, bfloat16, or another device")
    config.dtype = dtype
    config._attn_implementation = model.config._attn_implementation
    setattr(config, CARRIED_WIDTH, source.hidden_size)  # what drafts made for the source read of the target
    with torch.device("meta"):
        big = type(model)(config)
    big = big.to(dtype=dtype).to_empty(device=device)
    big.tie_weights()
    d = head_dim(model.config)
    places = layer_places(source.num_hidden_layers, shape.num_hidden_layers)
    sources = {_placed_name(name, places): p for name, p in model.named_parameters()}
    for name, p in big.named_parameters():
        p.zero_()  # new heads, units and layers: zero
        if name in sources:
            _fill(p, sources[name], name, source, shape, d)
    source_buffers = dict(model.named_buffers())
    for name, b in big.named_buffers():  # the rotary frequencies: the source's (same head size and theta)
        b.copy_(source_buffers[name].to(b.device)) if name in source_buffers else b.zero_()
    big.generation_config = type(model.generation_config).from_dict(model.generation_config.to_dict())
    return big.eval()


__all__ = ["LLAMA_TYPES", "SIZES", "Shape", "check_bigger", "check_layer_types", "check_llama_shaped", "inflate",
           "inflated_config", "layer_places", "parameter_bytes", "parse_size"]
