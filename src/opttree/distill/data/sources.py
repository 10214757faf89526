"""Training texts found on the machine itself (no downloads; never Spec-Bench): documents of
``/usr/share/doc`` and the Python reference topics, German gettext strings, the standard library's
functions. Two uses:

- *prompts* for the target to answer (:func:`document_prompts`: summarise, answer from a passage,
  extract, translate German → English, explain code; :func:`selfmade_prompts`: the library's
  templates × topics);
- *teacher-forced texts* (:func:`teacher_pairs`): a user turn and an existing text as the
  assistant's turn. No generation: the target's one forward over the pair gives the features and
  the soft labels at every position.

Everything is deterministic given the seed and the files present; the manifest records hashes
of what was made (see :mod:`opttree.distill.recipes.recipe_run`).
"""

from __future__ import annotations

import ast
import gettext
import glob
import gzip
import random
import sys
from functools import lru_cache
from pathlib import Path

from .chat_prompts import chat_prompts
from .prompts import CONTEXT_TEMPLATES, Prompt, passage, read_jsonl_prompts, seed_prompts

DOC_TASKS = CONTEXT_TEMPLATES + [
    "Extract the key terms from this text and return them as a JSON list:\n{text}",
    "{text}\n\nQuestion: What problem does this text describe, and what is the solution?",
    "Here is a document:\n{text}\n\nAnswer in one sentence: who is this text written for?",
    "Give a title to the following text and a one-paragraph summary.\n\n{text}",
    "Write a short news headline and a one-sentence lead for this text:\n\n{text}",
    "{text}\n\nUsing only the passage above, explain the most important term it uses.",
]
CODE_TASKS = ["Explain what this Python function does:\n\n{code}", "Write unit tests for this function:\n\n{code}",
              "Can you simplify this code?\n\n{code}", "Add comments and a docstring to this function:\n\n{code}",
              "Is there a bug in this code? Explain.\n\n{code}", "Rewrite this function in JavaScript:\n\n{code}"]
TEACHER_ASKS = ["Tell me about {name}.", "What does the documentation say about {name}?",
                "Write a passage about {name}.", "Explain {name} in detail."]


@lru_cache(maxsize=1)
def local_documents(min_chars: int = 3000) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` of the mostly-prose files of /usr/share/doc (no copyright files, no
    changelogs), then the Python reference topics (``pydoc_data``)."""
    docs = []
    for f in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        p = Path(f)
        if not p.is_file() or p.stat().st_size < min_chars or "copyright" in p.name or "changelog" in p.name.lower():
            continue
        try:
            opener = gzip.open(p, "rt", errors="ignore") if p.suffix == ".gz" else open(p, errors="ignore")
            with opener as fh:
                text = fh.read()
        except (OSError, EOFError, ValueError):
            continue
        head = text[:min_chars]
        prose = sum(c.isalpha() or c.isspace() for c in head) > 0.85 * len(head)
        if prose and head.count(". ") >= 10:  # sentences, not logs or lists of names
            docs.append((p.parent.name, text))
    try:
        import pydoc_data.topics as topics

        docs += [(f"the Python topic '{k}'", v) for k, v in sorted(topics.topics.items())]
    except ImportError:
        pass
    return tuple(docs)


@lru_cache(maxsize=1)
def german_strings() -> tuple[str, ...]:
    """German UI strings of the gettext catalogues: six words or more, no format codes, one line."""
    out = []
    for f in sorted(glob.glob("/usr/share/locale/de/LC_MESSAGES/*.mo")):
        try:
            with open(f, "rb") as fh:
                catalog = gettext.GNUTranslations(fh)._catalog
        except Exception:  # an unreadable or malformed catalogue: skip it
            continue
        out += [v for v in catalog.values() if isinstance(v, str) and len(v.split()) >= 6
                and "%" not in v and "\n" not in v.strip()]
    return tuple(out)


@lru_cache(maxsize=1)
def stdlib_functions(max_functions: int = 1000, max_bytes: int = 40_000) -> tuple[str, ...]:
    """Source of up to ``max_functions`` 150-1,200-character functions of the running Python's
    standard library (its top-level modules under ``max_bytes``: no site-packages, no tests)."""
    lib = Path(glob.__file__).parent
    funcs = []
    for f in sorted(lib.glob("*.py")):
        if f.stat().st_size > max_bytes:
            continue
        try:
            src = f.read_text(errors="ignore")
            tree = ast.parse(src)
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                seg = ast.get_source_segment(src, node) or ""
                if 150 < len(seg) < 1200:
                    funcs.append(seg)
        if len(funcs) >= max_functions:
            break
    return tuple(funcs[:max_functions])


def document_prompts(n: int, seed: int) -> list[Prompt]:
    """``n`` long-document tasks: 70 % tasks over passages of local documents, 15 % German →
    English over gettext strings, 15 % code tasks over standard-library functions."""
    rng = random.Random(seed)
    docs, german, funcs = local_documents(), german_strings(), stdlib_functions()
    out = []
    for i in range(n):
        r = i % 20
        if r < 3 and german:
            text = " ".join(rng.choice(german) for _ in range(rng.randint(1, 3)))
            out.append(Prompt("Translate German to English: " + text, "de-en"))
        elif r < 6 and funcs:
            out.append(Prompt(rng.choice(CODE_TASKS).format(code=rng.choice(funcs)), "code"))
        elif docs:
            out.append(Prompt(rng.choice(DOC_TASKS).format(text=passage(rng.choice(docs)[1], rng)), "doc"))
    return out


def selfmade_prompts(n: int, seed: int) -> list[Prompt]:
    """The library's templates × topics (:func:`opttree.distill.data.prompts.seed_prompts`)."""
    return seed_prompts(n, seed)


def teacher_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (user turn, assistant text) pairs: a passage of a local document or a standard-library
    function, as the answer to a question about it."""
    rng = random.Random(seed)
    docs, funcs = local_documents(), stdlib_functions()
    out = []
    for i in range(n):
        if i % 4 == 3 and funcs:
            code = rng.choice(funcs)
            out.append(("Show me a Python function from the standard library.", f"```python\n{code}\n```"))
        elif docs:
            name, text = rng.choice(docs)
            out.append((rng.choice(TEACHER_ASKS).format(name=name), passage(text, rng, 600, 1800)))
    return out


def prompts_of(kind: str, n: int, seed: int, base: Path | None = None) -> list[Prompt]:
    """Prompts of a recipe source: ``selfmade``, ``documents``, ``chat`` (the 13 Spec-Bench kinds of
    task, :mod:`opttree.distill.data.chat_prompts`) or a JSONL file (first ``n``)."""
    if kind == "chat":
        return chat_prompts(n, seed, local_documents(), german_strings())
    if kind == "selfmade":
        return selfmade_prompts(n, seed)
    if kind == "documents":
        return document_prompts(n, seed)
    path = Path(kind) if base is None or Path(kind).is_absolute() else base / kind
    if not path.exists():
        sys.exit(f"prompts {kind!r}: not 'selfmade', 'documents', 'chat' nor a file ({path})")
    prompts = read_jsonl_prompts(path)
    return prompts[:n] if n > 0 else prompts
