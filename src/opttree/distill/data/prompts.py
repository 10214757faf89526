"""Training prompts that the target model writes (or completes) for itself.

No fixed benchmark text is used: prompts are built from seed *topics* and *task templates*
(coding, maths, translation, summarising, QA with context, writing, roleplay, reasoning,
extraction, ...). Two rounds:

1. ``seed_prompts``: templates × topics, shuffled with a seeded RNG.
2. ``context_prompts``: tasks over the target's OWN round-1 answers — summarise this text,
   answer a question from it, translate its German back to English, extract facts — so that
   long-context tasks (summaries, RAG, translation) appear without any outside corpus.

A JSONL file of user prompts (one object per line with a ``prompt`` string, or a ``turns``
list whose first entry is used) can replace round 1 with :func:`read_jsonl_prompts`.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

TOPICS = [
    "volcanoes", "the French Revolution", "machine learning", "coffee", "the human heart",
    "black holes", "the stock market", "climate change", "honey bees", "the Roman Empire",
    "electric cars", "chess", "photosynthesis", "the internet", "jazz music", "the Moon landing",
    "antibiotics", "renewable energy", "the Great Wall of China", "sleep", "vaccines",
    "earthquakes", "social media", "the printing press", "rainforests", "inflation",
    "quantum computing", "the Olympic Games", "dinosaurs", "meditation", "recycling",
    "the Silk Road", "cryptocurrency", "ocean tides", "the immune system", "Shakespeare",
    "artificial satellites", "bread baking", "the water cycle", "public libraries",
    "remote work", "the Renaissance", "DNA", "hurricanes", "space tourism", "urban gardening",
    "the Amazon river", "video games", "ancient Egypt", "nuclear power", "marathon running",
    "smartphones", "the theory of evolution", "tea ceremonies", "wind turbines", "pandemics",
    "the Industrial Revolution", "coral reefs", "airline travel", "elections", "robots",
    "the solar system", "minimum wage", "penguins", "3D printing", "the Cold War",
    "small businesses", "plastic pollution", "the piano", "mountain climbing", "cybersecurity",
    "vitamins", "the Eiffel Tower", "self-driving cars", "bees and pollination", "tax policy",
    "the history of medicine", "football", "desert ecosystems", "online education",
    "the Mars rovers", "fermentation", "the Beatles", "supply chains", "glaciers", "gravity",
    "first aid", "housing prices", "the Byzantine Empire", "wolves", "solar panels",
    "job interviews", "time management", "a rainy city", "a lost dog", "a birthday party",
    "a new smartphone app", "a small bakery", "a school science fair", "a hiking trip",
]

NAMES = ["Alice", "Bob", "Maria", "Ken", "Priya", "Tom", "Lena", "Omar", "Sara", "Jin"]

CODING_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a text file",
    "merges two sorted lists", "finds the largest element in a list", "computes the factorial",
    "removes duplicates from a list", "parses a CSV file and sums a column",
    "implements binary search", "converts Celsius to Fahrenheit", "validates an email address",
    "computes Fibonacci numbers", "finds the most common word in a sentence",
    "sorts a dictionary by its values", "checks whether a string is a palindrome",
    "implements a simple stack class", "computes the average of a list of numbers",
    "flattens a nested list", "counts vowels in a string", "reads a JSON file and prints its keys",
]

LANGS = ["Python", "JavaScript", "C++", "Java", "SQL", "Rust"]

TEMPLATES = [
    "Write a short essay about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "What are the main advantages and disadvantages of {topic}?",
    "Write a blog post about {topic}.",
    "Give me five interesting facts about {topic}.",
    "Write a short story involving {topic}.",
    "Write a poem about {topic}.",
    "Compose a professional email to a colleague about {topic}.",
    "Pretend you are an expert on {topic}. Answer: why does it matter today?",
    "Describe the history of {topic} in a few paragraphs.",
    "What are common misconceptions about {topic}?",
    "Write a news report about a recent event related to {topic}.",
    "Summarize the key ideas of {topic} in bullet points.",
    "Create a quiz with three questions about {topic}.",
    "Compare {topic} with {topic2}.",
    "Write a persuasive argument in favour of {topic}.",
    "Imagine you are {name}, a tour guide. Describe {topic} to visitors.",
    "Write a dialogue between {name} and {name2} about {topic}.",
    "How does {topic} affect the economy?",
    "Translate into German: {topic} is an interesting subject that many people enjoy learning about.",
    "Translate into French: I read an article about {topic} yesterday and found it fascinating.",
    "Write a {lang} function that {task}.",
    "Develop a {lang} program that {task}. Explain the code.",
    "What is the time complexity of a {lang} function that {task}? Show an example.",
    "{name} has {a} apples and buys {b} more bags with {c} apples each. How many apples does "
    "{name} have now?",
    "A shop sells a book for ${a}. During a sale the price drops by {c}0%. What is the new price?",
    "{name} walks {a} km on Monday and {b} km more each day after that. How far does {name} walk "
    "in {c} days in total?",
    "Solve for x: {a}x + {b} = {c}{a}. Explain each step.",
    "What is the area of a rectangle with sides {a} cm and {b} cm? And its perimeter?",
    "If a train travels {a}0 km in {c} hours, what is its average speed?",
    "Who invented or discovered the key ideas behind {topic}?",
    "Answer briefly: what is {topic}?",
    "Give step-by-step instructions for learning about {topic}.",
    "Riddle: I am related to {topic}. Think step by step and describe a logical puzzle about it.",
    "List the pros and cons of {topic} in a table.",
]

CONTEXT_TEMPLATES = [
    "Summarize: {text}",
    "Summarize the following text in two sentences.\n\n{text}",
    "{text}\n\nBased on the passage above, what is the main point?",
    "Read the text and answer the question.\n\nText: {text}\n\nQuestion: What are the key facts "
    "mentioned?",
    "Extract all names, places and numbers from the following text as a list:\n{text}",
    "Rewrite the following text in a more formal tone:\n{text}",
    "{text}\n\nWrite three questions someone could ask about this text and answer them.",
]


@dataclass(frozen=True)
class Prompt:
    """One training prompt: ``text`` is the user message, ``kind`` a short label for stats."""

    text: str
    kind: str


def passage(text: str, rng: random.Random, low: int = 800, high: int = 2000) -> str:
    """A random piece of ``text``, ``low``-``high`` characters, starting at a paragraph if one is near."""
    start = rng.randrange(max(1, len(text) - high))
    para = text.find("\n\n", start, start + 400)
    start = para + 2 if para >= 0 else start
    return text[start:start + rng.randint(low, high)].strip()


def seed_prompts(n: int, seed: int) -> list[Prompt]:
    """``n`` round-1 prompts from templates × topics, deterministic in ``seed``."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)]
        text = template.format(
            topic=rng.choice(TOPICS), topic2=rng.choice(TOPICS), name=rng.choice(NAMES),
            name2=rng.choice(NAMES), lang=rng.choice(LANGS), task=rng.choice(CODING_TASKS),
            a=rng.randint(2, 40), b=rng.randint(2, 12), c=rng.randint(2, 9),
        )
        prompts.append(Prompt(text=text, kind=f"seed{TEMPLATES.index(template)}"))
    rng.shuffle(prompts)
    return prompts


def context_prompts(responses: list[tuple[Prompt, str]], n: int, seed: int) -> list[Prompt]:
    """``n`` round-2 prompts over the target's own round-1 ``(prompt, response)`` pairs."""
    rng = random.Random(seed + 1)
    german = [r for p, r in responses if p.text.startswith("Translate into German") and r.strip()]
    texts = [r for p, r in responses if len(r.split()) >= 40]
    texts = texts or [r for p, r in responses if r.strip()]  # short answers only: use them
    prompts = []
    for i in range(n):
        if german and i % 5 == 0:
            prompts.append(Prompt(f"Translate German to English: {rng.choice(german).strip()}", "ctx-de-en"))
        elif texts:
            template = rng.choice(CONTEXT_TEMPLATES)
            prompts.append(Prompt(template.format(text=rng.choice(texts).strip()), "ctx"))
    return prompts


def read_jsonl_prompts(path: str | Path) -> list[Prompt]:
    """User prompts from a JSONL file (gzipped if it ends in ``.gz``): a ``prompt`` string or the
    first of ``turns`` per line; ``category``, if there, is the prompt's kind."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    prompts = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        text = record["prompt"] if "prompt" in record else record["turns"][0]
        prompts.append(Prompt(text=text, kind=str(record.get("category", "jsonl"))))
    return prompts


def write_jsonl_prompts(prompts: list[Prompt], path: str | Path) -> Path:
    """``prompts`` as :func:`read_jsonl_prompts` reads them back (``{"prompt", "category"}`` per line;
    gzipped, byte for byte the same for the same prompts, if ``path`` ends in ``.gz``)."""
    path = Path(path)
    text = "".join(json.dumps({"prompt": p.text, "category": p.kind}) + "\n" for p in prompts)
    path.write_bytes(gzip.compress(text.encode(), mtime=0) if path.suffix == ".gz" else text.encode())
    return path
