"""An EAGLE-3 head made for a source target, inflated to draft the same q against the source's cost
stand-in (:func:`opttree.bench.inflate.inflate`), and written as a folder that vLLM and opttree serve
beside that stand-in (:func:`write_inflated_head`).

Notation: h the head's own hidden size, H the source target's, H' the inflated target's, L and L'
their layer counts. What changes (each step keeps the head's function; :func:`inflate_eagle3_head`):

- taps: the head reads ``output_hidden_states[t]`` of the source, the state entering source layer t;
  the inflated target carries that state in its first H entries at the layer :func:`tap_places`
  names (:func:`opttree.bench.inflate.layer_places`: source layer t is inflated layer t, the zero
  layers follow). The folder names them explicitly (``eagle_aux_hidden_state_layer_ids`` and
  SGLang's ``eagle_config`` form, :func:`opttree.loading.layer_ids.explicit_ids`), even where they
  equal the engines' default for L' layers: they are the source's taps, not the default's;
- ``fc`` [h, 3H] -> [h, 3H']: block j's H columns go to the first H of block j (the rest zero: they
  read the stand-in's zero entries), and the folder writes ``target_hidden_size`` H' (vLLM's
  ``llama_eagle3.py`` builds fc for ``target_hidden_size * 3`` inputs);
- the embedding: the head keeps its own (h wide), or takes the source target's [V, H] as its own
  ``embed_tokens``. It cannot share the stand-in's [V, H']: vLLM 0.32 shares the target's embedding
  only when the widths match (``llm_base_proposer.py`` ``_maybe_share_embeddings``), and opttree's
  loader refuses h != H' without one (:func:`opttree.loading.eagle_folder.check_target`);
- the layer, the norm, ``lm_head``, ``d2t``: unchanged (the vocabulary is the source's).

The inflated head's q equals the source head's q on the source target within float rounding, not
bit for bit: the stand-in's states differ from the source's by rounding (its norms' weights are
rescaled), and fc's sums run over 3H' inputs, zeros among them, in another order (on the tests' tiny
pair, fp32: q within 4.2e-7; fc alone, fed the source's states zero-padded, was bit-equal).

A head whose taps have no place in the inflated target, or a target that is not an inflation of the
head's own target, is refused in one line naming it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..loading.eagle.eagle3 import Eagle3Head
from ..hf.width import CARRIED_WIDTH, text_config
from ..loading.eagle_export import export_draft
from ..loading.eagle_folder import CONFIG_FILE, read_config
from ..loading.files import check_new_folder, written_whole
from ..loading.layer_ids import explicit_ids
from .inflate import INFLATED_FROM, layer_places, shape_of


def tap_places(taps: tuple[int, ...], source_layers: int, layers: int) -> tuple[int, ...]:
    """The source's taps (``output_hidden_states`` indices of a target of ``source_layers`` layers)
    -> the inflated target's (``layers`` layers) that carry the same states: tap t < L is the state
    entering source layer t, at the inflated layer that holds it; tap L (the last layer's output) is
    the state after the last source layer. A tap that has no place is refused by name."""
    places = layer_places(source_layers, layers)
    out = []
    for t in taps:
        if not 0 <= t <= source_layers:
            raise ValueError(f"the head's tap {t} is no layer of its {source_layers}-layer target")
        place = places[t] if t < source_layers else places[-1] + 1
        if place >= layers:
            raise ValueError(f"the head's tap {t} (the state entering layer {t} of its {source_layers}-layer target) "
                             f"does not exist in the inflated target, which has {layers} layers: inflate the head's "
                             "own target (bench.inflate.inflate) and pass that")
        out.append(place)
    return tuple(out)


def check_inflation(source_target, inflated_target) -> None:
    """``inflated_target`` must be ``source_target`` inflated: its config records the source's shape
    and carries its width, and its embedding's first columns are the source's (in its dtype, exactly);
    ValueError naming the mismatch otherwise."""
    source, inflated = text_config(source_target.config), text_config(inflated_target.config)
    record = inflated.to_dict().get(INFLATED_FROM)
    if not isinstance(record, dict):
        raise ValueError(f"the inflated target's config has no {INFLATED_FROM!r}: it is no cost stand-in; pass "
                         "inflate(source, size) or a folder written by opttree.bench.standin")
    want = asdict(shape_of(source))
    found = {k: record.get(k) for k in want}
    if found != want or inflated.to_dict().get(CARRIED_WIDTH) != source.hidden_size:
        raise ValueError(f"the inflated target was inflated from a model of shape {found} (carried width "
                         f"{inflated.to_dict().get(CARRIED_WIDTH)}), not from the head's target {want}: pass the "
                         "stand-in of the head's own target")
    mine = source_target.get_input_embeddings().weight.detach()  # [V, H]
    theirs = inflated_target.get_input_embeddings().weight.detach()  # [V, H']: inflate() copied mine, cast
    if theirs.shape[0] != mine.shape[0] or not torch.equal(theirs[:, :mine.shape[1]], mine.to(theirs)):
        raise ValueError("the inflated target's embedding is not the head's target's (inflate() copies it exactly): "
                         "pass the stand-in of the head's own target")


def _source_head(head, source_target) -> Eagle3Head:
    """``head``: a loaded EAGLE-3 head (checked to fit ``source_target``) or its folder (loaded for it)."""
    if isinstance(head, (str, Path)):
        from ..loading.eagle_folder import load_eagle

        head = load_eagle(head, source_target)
    if not isinstance(head, Eagle3Head):  # a speculators head is one too (EAGLE-3 compute, another folder)
        raise ValueError(f"inflate_eagle3_head takes an EAGLE-3 head (a folder, or opttree.load_draft's Eagle3Head); "
                         f"this is a {type(head).__name__}")
    head.check_fits(source_target)
    return head


def _widened_fc(fc: torch.Tensor, taps: int, width: int, wide: int) -> torch.Tensor:
    """fc [h, taps * width] -> [h, taps * wide]: block j's columns at the start of block j, zeros after."""
    out = fc.new_zeros(fc.shape[0], taps, wide)  # [h, taps, H']
    out[:, :, :width] = fc.view(fc.shape[0], taps, width)
    return out.view(fc.shape[0], taps * wide)


@torch.no_grad()
def inflate_eagle3_head(head, source_target, inflated_target) -> Eagle3Head:
    """``head`` (an EAGLE-3 head for ``source_target``: loaded, or its folder) as a head for
    ``inflated_target`` (``inflate(source_target, size)``) that drafts the same q (module doc), in the
    head's dtype on its device. ``head`` is left as it is."""
    head = _source_head(head, source_target)
    c, wide = head.c, text_config(inflated_target.config)
    layers = wide.num_hidden_layers
    taps = tap_places(c.taps, c.target_layers, layers)  # first: a tap the target lacks is named as such
    check_inflation(source_target, inflated_target)
    new_c = replace(c, target_hidden_size=wide.hidden_size, target_layers=layers, taps=taps, own_embedding=True)
    big = Eagle3Head(new_c, None, head.d2t.clone())
    state = dict(head.state_dict())
    state["fc.weight"] = _widened_fc(state["fc.weight"], len(c.taps), c.target_hidden_size, wide.hidden_size)
    state["embed_tokens.weight"] = head.embedding().weight.detach().to(head.fc.weight)  # [V, h]
    big.load_state_dict(state)
    return big.to(device=head.device, dtype=head.dtype).eval()


def write_inflated_head(head, source_target, inflated_target, folder: str | Path,
                        dtype: torch.dtype | None = None) -> Path:
    """:func:`inflate_eagle3_head` written by :func:`opttree.export_draft` (EAGLE-3 layout) to
    ``folder`` (new or empty, written whole), in ``dtype`` (default: the head's), with its taps named
    explicitly. -> the folder."""
    folder = Path(folder)
    check_new_folder(folder)
    big = inflate_eagle3_head(head, source_target, inflated_target)
    if dtype is not None:
        big = big.to(dtype)
    with written_whole(folder) as partial:
        export_draft(big, partial)
        config = read_config(partial)
        config.update(explicit_ids(big.c.taps, big.c.target_layers))
        (partial / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


__all__ = ["check_inflation", "inflate_eagle3_head", "tap_places", "write_inflated_head"]
