"""Round 3 of self-distillation data for the SmolLM2 feature head (no Spec-Bench text).

A bf16 target answers, greedily, prompts built on this machine:
- the library's templates x topics (built-in topics + whole-word vocabulary tokens, new seed);
- extra templates written for this round: roleplay personas, logic puzzles, multi-step word
  problems, short factual questions, "explain this code" over local Python stdlib functions,
  JSON extraction and question answering over local documents;
- "Translate German to English:" over German gettext strings of this machine;
- summarise / extract / answer over pieces of local English documents.
Prompts are answered in parts of 512 (part_00, part_01, ...) so that a run stopped early still
holds a mix of every kind. Usage: gen3.py OUT_DIR SEED N_PARTS
"""
import ast, glob, logging, random, sys, torch
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from pathlib import Path
from opttree.distill import prompts as P
from opttree.distill.data import DataConfig, generate_round
from opttree.smollm2 import load_smollm2
from local_texts import english_documents, german_strings

out, seed, parts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
t, tok = load_smollm2(dtype=torch.bfloat16)
words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("Ġ") and w[1:].isalpha() and len(w) >= 7 and w[1].islower())
rng.shuffle(words)
topics = P.TOPICS + words[:4000]
P.TOPICS = topics
names = P.NAMES + ["Ahmed", "Chloe", "Diego", "Fatima", "Hiro", "Ivan", "Nora", "Raj", "Yuki", "Zoe"]

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
def extra_prompts(n):
    out_ = []
    for i in range(n):
        tpl = EXTRA[i % len(EXTRA)]
        out_.append(P.Prompt(tpl.format(persona=rng.choice(PERSONAS), topic=rng.choice(topics),
                    topic2=rng.choice(topics), name=rng.choice(names), name2=rng.choice(names),
                    name3=rng.choice(names), word=rng.choice(words[4000:]), a=rng.randint(2, 60),
                    b=rng.randint(2, 15), c=rng.randint(2, 9)), f"extra{i % len(EXTRA)}"))
    return out_

# Python functions from the local standard library, for "explain / improve this code".
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
rng.shuffle(funcs)
CODE = ["Explain what this Python function does:\n\n{code}", "Write unit tests for this function:\n\n{code}",
        "Can you simplify this code?\n\n{code}", "Add comments and a docstring to this function:\n\n{code}",
        "Is there a bug in this code? Explain.\n\n{code}", "Rewrite this function in JavaScript:\n\n{code}"]

german = german_strings()
rng.shuffle(german)

docs = english_documents()
rng.shuffle(docs)
DOC = P.CONTEXT_TEMPLATES + [
    "Extract the key terms from this text and return them as a JSON list:\n{text}",
    "{text}\n\nQuestion: What problem does this text describe, and what is the solution?",
    "Here is a document:\n{text}\n\nAnswer in one sentence: who is this text written for?",
    "Give a title to the following text and a one-paragraph summary.\n\n{text}",
]

per = 512
prompts = []
for k in range(parts):
    part = P.seed_prompts(170, seed * 100 + k) + extra_prompts(150)
    part += [P.Prompt(rng.choice(CODE).format(code=funcs[(k * 40 + i) % len(funcs)]), "code") for i in range(40)]
    part += [P.Prompt("Translate German to English: " + " ".join(german[(k * 150 + 3 * i) % len(german):][:rng.randint(1, 3)]), "de-en") for i in range(50)]
    for i in range(per - len(part)):
        d = rng.choice(docs)
        s = rng.randrange(max(1, len(d) - 2000))
        part.append(P.Prompt(rng.choice(DOC).format(text=d[s:s + rng.randint(800, 2000)].strip()), "doc"))
    rng.shuffle(part)
    prompts.append(part)
print(parts, "parts of", per, "prompts;", len(funcs), "functions,", len(german), "German strings,", len(docs), "documents", flush=True)
cfg = DataConfig(max_new_tokens=128, batch_size=64, topk=16, max_prompt_tokens=640)
for k, part in enumerate(prompts):
    generate_round(t, tok, part, out / f"part_{k:02d}", cfg)
