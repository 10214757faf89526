"""What keeping every slot would cost a sliding-window model: opttree's verification forward on a cache
whose sliding layers hold only the window (what one prompt runs on: ``kv_cache.WindowLayer``, window
- 1 committed slots and the step's) against the same forward on a cache whose sliding layers keep the
whole sequence (what a batch of prompts runs on, whose rows sit at other positions; the tree masks
hide what the window hides either way), at several sequence lengths; plus the cache's size either way.

The model is SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3 KV heads, vocab 49,152) as a
Mistral with every layer sliding over ``--window`` tokens (GPT-OSS: 128), random weights, float32,
on the CPU. Each forward verifies ``--rows`` rows (a root and a tree padded to a verification size);
medians of ``--repeats`` timed runs after one warm-up, the two caches taking turns.

    .venv/bin/python benchmarks/window_cache.py
    .venv/bin/python benchmarks/window_cache.py --lengths 256 1024 4096 --window 128 --rows 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers as tf

from opttree.hf import kv_cache
from opttree.hf.compat import with_cache
from opttree.tree.layout import MaskLayout


def model(window: int, layers: int) -> tf.PreTrainedModel:
    torch.manual_seed(0)
    config = tf.MistralConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                              num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=16384,
                              sliding_window=window)
    config._attn_implementation = "sdpa"
    return tf.MistralForCausalLM(config).eval()


def forward_inputs(layout: MaskLayout, first_key: int, length: int, rows: int, dtype) -> dict:
    """A chain of ``rows`` new tokens at positions length … length + rows - 1 over cached keys holding
    sequence indices first_key … length - 1 (the tree's shape does not change the forward's cost)."""
    kept = length - first_key
    queries = torch.arange(length, length + rows)[None]  # [1, q]
    keys = torch.cat([torch.arange(first_key, length), queries[0]])[None]  # [1, kept + q]
    visible = torch.ones(1, rows, kept + rows, dtype=torch.bool)
    visible[0, :, kept:] = torch.ones(rows, rows, dtype=torch.bool).tril()
    return dict(input_ids=torch.full((1, rows), 7), attention_mask=layout.masks(visible, queries, keys, dtype),
                position_ids=queries, cache_position=torch.arange(kept, kept + rows))


def cut(cache, keep: int):
    """A copy of ``cache`` holding only its last ``keep`` slots."""
    out = type(cache)()
    for layer in cache.layers:
        out.update(layer.keys[..., -keep:, :].clone(), layer.values[..., -keep:, :].clone(), len(out.layers))
    return out


def timed(target, cache, inputs: dict, slots: int) -> float:
    start = time.perf_counter()
    target(**inputs, **with_cache(target, cache), use_cache=True, logits_to_keep=0)
    seconds = time.perf_counter() - start
    kv_cache.rewind(cache, slots)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = model(args.window, args.layers)
    layout = MaskLayout.of(target.config)
    print(f"window {args.window}, {args.rows} rows, {args.layers} layers, {args.threads} thread(s), float32, "
          f"torch {torch.__version__}, transformers {tf.__version__}")
    print("| sequence | every slot kept (ms) | the window kept (ms) | every slot / the window | cache MB every slot / window |")
    print("|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for length in args.lengths:
            full = kv_cache.new_cache(target)
            target(input_ids=torch.randint(3, 49152, (1, length)), **with_cache(target, full), use_cache=True,
                   logits_to_keep=1)
            keep = min(length, args.window - 1)
            window = cut(full, keep)
            runs = {"full": [], "window": []}
            inputs = {"full": forward_inputs(layout, 0, length, args.rows, target.dtype),
                      "window": forward_inputs(layout, length - keep, length, args.rows, target.dtype)}
            for repeat in range(args.repeats + 1):
                for name, cache in (("full", full), ("window", window)):
                    seconds = timed(target, cache, inputs[name], kv_cache.cache_length(cache))
                    if repeat:
                        runs[name].append(seconds)
            size = {name: sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 4 / 2 ** 20
                    for name, cache in (("full", full), ("window", window))}
            kept, short = statistics.median(runs["full"]) * 1e3, statistics.median(runs["window"]) * 1e3
            print(f"| {length} | {kept:.1f} | {short:.1f} | {kept / short:.2f}x | {size['full']:.1f} / "
                  f"{size['window']:.1f} |")


if __name__ == "__main__":
    main()
