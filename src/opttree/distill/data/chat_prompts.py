"""Chat prompts of the 13 kinds of task Spec-Bench asks, written from seed topics (never its text).

A head trained mostly on teacher-forced documents gains only on text like them; this source asks
what chat users ask, one kind in turn:

writing, roleplay, reasoning, math, coding, extraction, STEM, humanities, translation,
summarization, QA, math reasoning and retrieval-augmented answers (RAG).

Topics come from :data:`opttree.distill.data.prompts.TOPICS` plus the wider lists below; passages for
summarization, extraction and RAG come from the machine's own documents
(:func:`opttree.distill.data.sources.local_documents`), German for translation from its gettext
catalogues. Everything is deterministic in the seed and the files present.
"""

from __future__ import annotations

import random

from .prompts import CODING_TASKS, LANGS, NAMES, TOPICS, Prompt, passage

KINDS = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
         "translation", "summarization", "qa", "math_reasoning", "rag")

STEM_TOPICS = [
    "entropy", "the Doppler effect", "plate tectonics", "enzymes", "semiconductors", "photosynthesis",
    "Newton's laws of motion", "the periodic table", "electromagnetic induction", "mitosis",
    "the greenhouse effect", "neural networks", "hash tables", "prime numbers", "radioactive decay",
    "the speed of light", "ocean currents", "genetic mutation", "vaccination", "superconductors",
    "the Pythagorean theorem", "probability", "binary numbers", "antibiotic resistance", "lasers",
    "the ozone layer", "batteries", "nuclear fusion", "cell membranes", "sound waves",
]
HUMANITIES_TOPICS = [
    "the Enlightenment", "utilitarianism", "the Harlem Renaissance", "Greek tragedy", "feudalism",
    "impressionist painting", "the Magna Carta", "existentialism", "the Meiji Restoration",
    "Baroque music", "the Reformation", "colonialism in Africa", "the Ming dynasty", "stoicism",
    "Romantic poetry", "the civil rights movement", "the Ottoman Empire", "free will",
    "modern architecture", "the Cold War", "democracy in ancient Athens", "folk tales",
    "the printing press", "cultural relativism", "the Bauhaus", "epic poetry", "the Silk Road",
]
PERSONAS = [
    "a pirate captain", "a medieval knight", "a detective in 1920s London", "a friendly robot",
    "a grumpy chef", "an astronaut on Mars", "a wise old wizard", "a sports commentator",
    "a nervous job applicant", "a travel agent", "a museum guide", "a famous scientist",
    "a kindergarten teacher", "a stand-up comedian", "a park ranger", "a fitness coach",
]
THINGS = ["apples", "books", "marbles", "tickets", "cookies", "pencils", "stamps", "coins"]

TEMPLATES: dict[str, list[str]] = {
    "writing": [
        "Write a short story about {topic} with a surprising ending.",
        "Compose a heartfelt letter to a friend about {topic}.",
        "Write a product description for a new gadget related to {topic}.",
        "Draft a speech for a school graduation that mentions {topic}.",
        "Write a travel blog post about a trip where you learned about {topic}.",
        "Write a limerick about {topic}, then explain the joke.",
        "Rewrite this sentence to be more engaging: \"{topic} is an important subject.\"",
    ],
    "roleplay": [
        "Pretend to be {persona}. Introduce yourself and talk about {topic}.",
        "You are {persona}. A customer asks you about {topic}. How do you reply?",
        "Act as {persona} and give me advice about {topic}.",
        "Stay in character as {persona}: describe your typical day, including {topic}.",
        "Imagine you are {persona} writing a diary entry about {topic}.",
    ],
    "reasoning": [
        "{name} is taller than {name2}, and {name2} is taller than {name3}. Who is the shortest? Explain.",
        "If all {things} in a box are red and some red things are heavy, must some {things} be heavy? "
        "Think step by step.",
        "{name} finished a race ahead of {name2} but behind {name3}. In which place did {name2} finish "
        "if there were only three runners?",
        "A clock shows 3:15. What is the angle between the hour and the minute hands? Explain your "
        "reasoning.",
        "Which is the odd one out: {topic}, {topic2}, a banana, or a violin? Explain why.",
        "Is the following argument valid? 'Every expert on {topic} reads a lot. {name} reads a lot. "
        "So {name} is an expert on {topic}.'",
    ],
    "math": [
        "Solve for x: {a}x - {b} = {c}. Show your work.",
        "What is the sum of the first {a} positive integers?",
        "Find the area of a triangle with base {a} cm and height {b} cm.",
        "Simplify ({a}x + {b}) - ({c}x - {b}).",
        "What is {a}% of {big}?",
        "A circle has a radius of {b} cm. What are its area and circumference?",
        "Find the greatest common divisor of {big} and {a}.",
    ],
    "coding": [
        "Write a {lang} function that {task}.",
        "Implement a {lang} class for a simple bank account with deposit and withdraw methods.",
        "Explain the difference between a list and a tuple in Python, with examples.",
        "Write a SQL query that finds the five customers with the most orders.",
        "How do I read a file line by line in {lang}? Give an example.",
        "Write a recursive {lang} function that {task}, and explain its time complexity.",
        "What does this code print, and why?\n\nx = [1, 2, 3]\ny = x\ny.append({a})\nprint(x)",
    ],
    "extraction": [
        "Extract every date, person and place from this text as JSON:\n\n{passage}",
        "List the main topics mentioned in the following text, one per line:\n\n{passage}",
        "From the text below, extract all technical terms and give a one-line definition of each.\n\n"
        "{passage}",
        "Read this and return a JSON object with the keys \"subject\", \"audience\" and \"key_points\":"
        "\n\n{passage}",
    ],
    "stem": [
        "Explain {stem} in simple terms.",
        "What is {stem}, and why does it matter in everyday life?",
        "Describe an experiment that demonstrates {stem}.",
        "How would you explain {stem} to a high-school student? Use an analogy.",
        "What are the most common misconceptions about {stem}?",
    ],
    "humanities": [
        "Discuss the significance of {hum} in history.",
        "What were the main causes and consequences of {hum}?",
        "Compare {hum} with {hum2}.",
        "How has {hum} influenced modern society?",
        "Write a short essay on the legacy of {hum}.",
    ],
    "translation": [
        "Translate German to English: {german}",
        "Translate the following sentence from German into English: {german}",
        "Translate into English: {german}",
    ],
    "summarization": [
        "Summarize the following article in a few sentences.\n\n{passage}",
        "Summarize: {passage}",
        "Write a one-paragraph summary of this text:\n\n{passage}",
        "{passage}\n\nTL;DR:",
    ],
    "qa": [
        "What is {topic}?",
        "Who is known for {topic}?",
        "When did people first start using {topic}?",
        "Why is {topic} important?",
        "Where can I learn more about {topic}?",
        "How does {topic} work?",
    ],
    "math_reasoning": [
        "{name} has {a} {things}. {name} gives {b} to {name2} and then buys {c} packs of {b} {things}. "
        "How many {things} does {name} have now?",
        "A shop sells {things} at ${b} each. {name} buys {a} of them and pays with a ${big} note. How "
        "much change does {name} get?",
        "{name} reads {a} pages a day. How many days does it take to read a book of {big} pages?",
        "A train leaves at 9:00 and travels at {a}0 km/h. Another leaves the same station at 10:00 at "
        "{b}0 km/h in the same direction. When does the second catch up, if ever?",
        "{name} saves ${a} each week. After {c} weeks {name} spends half of the savings. How much is "
        "left?",
        "There are {a} students in a class. {c}0% of them play football and half of the rest play "
        "chess. How many play chess?",
    ],
    "rag": [
        "{passage}\n\nBased on the passage above, answer: what is the main point the author makes?",
        "Use the context to answer the question.\n\nContext: {passage}\n\nQuestion: What does the text "
        "say about {name_doc}?",
        "Document:\n{passage}\n\nAccording to the document, what should the reader do first?",
        "{passage}\n\nQuestion: Which details in the text are the most important? Answer briefly.",
    ],
}

PASSAGE_KINDS = {"extraction", "summarization", "rag"}


def chat_prompts(n: int, seed: int, docs: tuple[tuple[str, str], ...] = (),
                 german: tuple[str, ...] = ()) -> list[Prompt]:
    """``n`` prompts, the 13 kinds in turn (``Prompt.kind`` names the kind), deterministic in ``seed``.

    docs: ``(name, text)`` documents for summarization, extraction and RAG; german: sentences to
    translate (:func:`opttree.distill.data.sources.local_documents`, ``german_strings``). A kind whose
    text is missing becomes a QA prompt, so ``n`` prompts always come back.
    """
    rng = random.Random(seed)
    out: list[Prompt] = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if (kind in PASSAGE_KINDS and not docs) or (kind == "translation" and not german):
            kind = "qa"
        template = rng.choice(TEMPLATES[kind])
        name, name2, name3 = rng.sample(NAMES, 3)
        doc_name, doc = rng.choice(docs) if docs else ("", "")
        text = template.format(
            topic=rng.choice(TOPICS), topic2=rng.choice(TOPICS), stem=rng.choice(STEM_TOPICS),
            hum=rng.choice(HUMANITIES_TOPICS), hum2=rng.choice(HUMANITIES_TOPICS),
            persona=rng.choice(PERSONAS), things=rng.choice(THINGS), name=name, name2=name2,
            name3=name3, lang=rng.choice(LANGS), task=rng.choice(CODING_TASKS),
            a=rng.randint(3, 48), b=rng.randint(2, 12), c=rng.randint(2, 9), big=rng.randint(50, 500),
            german=" ".join(rng.choice(german) for _ in range(rng.randint(1, 3))) if german else "",
            passage=passage(doc, rng, 600, 1600) if kind in PASSAGE_KINDS else "", name_doc=doc_name,
        )
        out.append(Prompt(text=text, kind=kind))
    return out
