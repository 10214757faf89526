"""A draft folder made on a float32 target loads onto the same target in bf16/fp16 without a
false "wrong target" warning, and still warns for a different target."""

import copy

import torch

from models import tiny_model
from opttree.loading.files import embedding_checksum, embedding_matches


def wide_target(seed=0, centred=True):
    """A target whose embedding rows are large and cancel in the sum (as a real model's may): the
    float32 checksum is near 0 while each weight's rounding in bf16 is not."""
    target = tiny_model("llama", seed=seed, hidden=256)
    with torch.no_grad():
        weight = target.get_input_embeddings().weight
        weight.mul_(40.0)
        if centred:
            weight[:64] -= weight[:64].mean()
    return target


def test_the_same_target_in_low_precision_matches_its_float32_checksum():
    target = wide_target()
    checksum = embedding_checksum(target)
    assert embedding_matches(target, checksum)
    for dtype in (torch.bfloat16, torch.float16):
        low = copy.deepcopy(target).to(dtype)
        assert abs(embedding_checksum(low) - checksum) > 1e-3 * max(1.0, abs(checksum))  # a fixed tolerance fails
        assert embedding_matches(low, checksum), dtype


def test_another_target_does_not_match_in_any_precision():
    target = wide_target()
    checksum = embedding_checksum(target)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert not embedding_matches(wide_target(seed=1, centred=False).to(dtype), checksum), dtype
        shifted = copy.deepcopy(target)
        with torch.no_grad():
            shifted.get_input_embeddings().weight[:64] += 0.5  # a fine-tuned embedding
        assert not embedding_matches(shifted.to(dtype), checksum), dtype
