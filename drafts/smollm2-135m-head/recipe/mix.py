"""The prompt mix of rounds 3 and 5 (no Spec-Bench text), shared by gen3.py and prompts5.py.

``Mix(tok, rng)`` gathers the ingredients (vocabulary words as extra topics, local Python
functions, German gettext strings, local English documents); ``Mix.part(k, seed)`` builds a
part of 512 prompts: library templates x topics, the extra templates below, code tasks over
stdlib functions, German -> English, and tasks over pieces of documents.
"""
import ast, glob, random

from opttree.distill import prompts as P
from local_texts import english_documents, german_strings

PERSONAS = ["a pirate captain", "a medieval knight", "a detective in 1920s London", "a friendly robot",
            "a famous chef", "a sports coach", "a time traveller from the year 3000", "a museum guide",
            "a grumpy wizard", "an astronaut on the Moon", "a kindergarten teacher", "a stand-up comedian",
            "a doctor", "a startup founder", "a poet", "a park ranger", "a history professor",
            "a customer service agent", "a travel blogger", "a personal trainer"]
EXTRA = [
    "Pretend you are {persona}. Tell me about your typical day.",
    "Act as {persona}. How would you respond if someone asked you about {topic}?",
    "You are {persona}. Give me advice about {topic}.",
    "Imagine yourself as {persona}. Describe how you feel about {topic}.",
    "{name} is older than {name2}, and {name2} is older than {name3}. Who is the youngest? Explain your reasoning.",
    "There are {a} birds on a tree. {b} fly away and then {c} more arrive. How many birds are on the tree now?",
    "{name} earns ${a}0 per day and spends ${b} per day on food. How much does {name} save in {c} weeks?",
    "A recipe needs {b} eggs for {c} people. How many eggs are needed for {a} people? Show your work.",
    "{name} reads {b} pages every day. The book has {a}0 pages. How many days will it take to finish it?",
    "A class has {a} students. {c}0% of them are girls. How many boys are there?",
    "What is {a} multiplied by {b}, plus {c}? Explain step by step.",
    "If {name} runs {b} laps of a {a}00 m track, how many kilometres does {name} run?",
    "Is it true that {topic} is related to {topic2}? Think step by step.",
    "When did people first start studying {topic}?",
    "Where in the world is {topic} most important, and why?",
    "What does the word '{word}' mean? Use it in three sentences.",
    "Write a haiku about {topic}.",
    "Write a limerick about {word}.",
    "Write a product description for a new gadget related to {topic}.",
    "Write a motivational speech about {topic} for high school students.",
    "Give me a short summary of what {topic} is and why people care about it.",
    "Explain the science behind {topic}.",
    "What ethical questions does {topic} raise?",
    "How would you teach {topic} to adults in one hour?",
    "Write a short dialogue in which {name} explains {topic} to {name2}.",
    "Suggest five names for a company that works on {topic}.",
    "Write a cover letter for a job related to {topic}.",
    "What are the steps to start a career in {topic}?",
]
CODE = ["Explain what this Python function does:\n\n{code}", "Write unit tests for this function:\n\n{code}",
        "Can you simplify this code?\n\n{code}", "Add comments and a docstring to this function:\n\n{code}",
        "Is there a bug in this code? Explain.\n\n{code}", "Rewrite this function in JavaScript:\n\n{code}"]

DOC = P.CONTEXT_TEMPLATES + [
    "Extract the key terms from this text and return them as a JSON list:\n{text}",
    "{text}\n\nQuestion: What problem does this text describe, and what is the solution?",
    "Here is a document:\n{text}\n\nAnswer in one sentence: who is this text written for?",
    "Give a title to the following text and a one-paragraph summary.\n\n{text}",
]



def vocab_words(tok) -> list[str]:
    """Lower-case whole-word vocabulary tokens of 7+ letters, sorted."""
    return sorted(w[1:] for w in tok.get_vocab() if w.startswith("Ġ") and w[1:].isalpha() and len(w) >= 7 and w[1].islower())


def stdlib_functions() -> list[str]:
    """Source of 150-1,200-character functions of the local Python standard library."""
    funcs = []
    for f in sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))[:3000]:
        try:
            src = open(f, errors="ignore").read()
            tree = ast.parse(src)
        except Exception:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                seg = ast.get_source_segment(src, node) or ""
                if 150 < len(seg) < 1200:
                    funcs.append(seg)
    return funcs


class Mix:
    def __init__(self, tok, rng: random.Random):
        self.rng = rng
        self.words = vocab_words(tok)
        rng.shuffle(self.words)
        self.topics = P.TOPICS + self.words[:4000]
        P.TOPICS = self.topics  # seed_prompts draws its topics from here
        self.names = P.NAMES + ["Ahmed", "Chloe", "Diego", "Fatima", "Hiro", "Ivan", "Nora", "Raj", "Yuki", "Zoe"]
        self.funcs = stdlib_functions()
        rng.shuffle(self.funcs)
        self.german = german_strings()
        rng.shuffle(self.german)
        self.docs = english_documents()
        rng.shuffle(self.docs)

    def extra_prompts(self, n: int) -> list[P.Prompt]:
        rng, out = self.rng, []
        for i in range(n):
            tpl = EXTRA[i % len(EXTRA)]
            out.append(P.Prompt(tpl.format(persona=rng.choice(PERSONAS), topic=rng.choice(self.topics),
                       topic2=rng.choice(self.topics), name=rng.choice(self.names), name2=rng.choice(self.names),
                       name3=rng.choice(self.names), word=rng.choice(self.words[4000:]), a=rng.randint(2, 60),
                       b=rng.randint(2, 15), c=rng.randint(2, 9)), f"extra{i % len(EXTRA)}"))
        return out

    def part(self, k: int, seed: int, per: int = 512) -> list[P.Prompt]:
        rng = self.rng
        part = P.seed_prompts(170, seed * 100 + k) + self.extra_prompts(150)
        part += [P.Prompt(rng.choice(CODE).format(code=self.funcs[(k * 40 + i) % len(self.funcs)]), "code") for i in range(40)]
        part += [P.Prompt("Translate German to English: " + " ".join(self.german[(k * 150 + 3 * i) % len(self.german):][:rng.randint(1, 3)]), "de-en") for i in range(50)]
        for i in range(per - len(part)):
            d = rng.choice(self.docs)
            s = rng.randrange(max(1, len(d) - 2000))
            part.append(P.Prompt(rng.choice(DOC).format(text=d[s:s + rng.randint(800, 2000)].strip()), "doc"))
        rng.shuffle(part)
        return part
