"""Chat prompts for the draft head's training data (docs/draft.md, "Data").

    python -m draft.prompts --out FILE.jsonl --count N [--seed S]

Magpie prompts (the target writes its own user turns) are mostly requests for advice: a 135M
model rarely asks itself for code, arithmetic, a rewrite of a given sentence or a list. Users do,
and the head then drafts answers it has never seen. This writes N distinct user prompts of those
kinds from templates and word lists of this file (written for this project, never from the
benchmark set ../shared/data/prompts/), one JSON line each, {"id", "category", "messages"}, the
format `specula draft-data --prompts` and `bench spec` read. The answers are still the target's
own: only the questions come from here. Deterministic for a seed.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

SUBJECTS = [
    "photosynthesis", "the water cycle", "plate tectonics", "black holes", "the immune system", "volcanoes",
    "the French Revolution", "the Roman Empire", "the printing press", "the industrial revolution", "inflation",
    "supply and demand", "compound interest", "machine learning", "the internet", "blockchain", "vaccines",
    "climate change", "renewable energy", "nuclear fission", "the moon's phases", "tides", "rainbows",
    "earthquakes", "the human heart", "DNA", "evolution", "gravity", "electricity", "magnetism", "sound waves",
    "the stock market", "democracy", "the Renaissance", "ancient Egypt", "the Silk Road", "the Cold War",
    "recycling", "composting", "sleep", "memory", "muscle growth", "nutrition", "coffee", "tea", "chocolate",
    "bread baking", "fermentation", "bees", "ants", "whales", "dinosaurs", "coral reefs", "rainforests", "deserts",
    "glaciers", "hurricanes", "lightning", "the northern lights", "satellites", "GPS", "solar panels",
    "wind turbines", "electric cars", "batteries", "airplanes", "submarines", "bridges", "skyscrapers",
    "the Olympic Games", "chess", "jazz", "opera", "impressionism", "poetry", "the novel", "photography",
    "cinema", "video games", "social media", "email", "encryption", "passwords", "databases", "operating systems",
    "compilers", "recursion", "sorting algorithms", "binary numbers", "prime numbers", "probability", "statistics",
    "the Pythagorean theorem", "fractions", "percentages", "taxes", "budgeting", "public speaking", "negotiation",
    "time management", "meditation", "yoga", "running", "swimming", "gardening", "houseplants", "bird migration",
    "the Great Wall of China", "the pyramids", "the Amazon river", "Mount Everest", "the Sahara", "Antarctica",
    "the solar system", "Mars", "Jupiter", "comets", "the speed of light", "time zones", "calendars", "maps",
    "languages", "grammar", "translation", "libraries", "museums", "architecture", "pottery", "knitting",
]

ACTIVITIES = [
    "learn a new language", "study for an exam", "cook rice", "make pancakes", "start running", "save money",
    "write a resume", "prepare for a job interview", "fall asleep faster", "keep houseplants alive",
    "organize a small kitchen", "plan a road trip", "learn to play guitar", "start a vegetable garden",
    "clean a laptop keyboard", "write a cover letter", "make new friends in a new city", "reduce screen time",
    "learn to code", "give a good presentation", "train a puppy", "brew coffee at home", "paint a room",
    "change a bike tire", "make a budget", "pack for a week-long trip", "stay focused while working from home",
    "read more books", "improve handwriting", "bake sourdough bread", "write a short story", "take better photos",
    "care for a cat", "set up a home network", "back up a computer", "learn chess", "make a smoothie",
    "stay hydrated", "prepare for a marathon", "host a dinner party", "learn to swim", "write a thank-you note",
]

THINGS = [
    "a refrigerator", "a microwave oven", "a bicycle", "a camera", "a telescope", "a compass", "a thermostat",
    "a credit card", "a search engine", "a vaccine", "a rocket", "a jet engine", "a heat pump", "a hard drive",
    "a touchscreen", "a battery", "a solar cell", "a lock and key", "a clock", "a printer", "Wi-Fi", "a web browser",
    "a submarine", "an elevator", "a parachute", "a piano", "a light bulb", "a car engine", "a wind turbine",
]

PAIRS = [
    ("a lake", "a pond"), ("weather", "climate"), ("a virus", "a worm in computing"), ("speed", "velocity"),
    ("mass", "weight"), ("a simile", "a metaphor"), ("RAM", "storage"), ("a crocodile", "an alligator"),
    ("baking soda", "baking powder"), ("a hurricane", "a tornado"), ("a democracy", "a republic"),
    ("an asteroid", "a meteor"), ("TCP", "UDP"), ("a list", "a tuple in Python"), ("stocks", "bonds"),
    ("a frog", "a toad"), ("an ocean", "a sea"), ("empathy", "sympathy"), ("a compiler", "an interpreter"),
    ("a rabbit", "a hare"), ("fission", "fusion"), ("AC", "DC current"), ("a county", "a country"),
    ("latitude", "longitude"), ("a cold", "the flu"), ("Git", "GitHub"), ("a noun", "a verb"),
]

PEOPLE = [
    "a busy student", "a retired teacher", "a new parent", "a software engineer", "a small business owner",
    "a nurse working night shifts", "a beginner cook", "a child who loves space", "a tourist in Paris",
    "someone who just moved to a new country", "a high school science class", "a group of hikers",
]

FORMS = ["poem", "haiku", "story", "limerick", "song chorus", "fable", "diary entry", "letter", "riddle"]
MOODS = ["cheerful", "calm", "mysterious", "funny", "hopeful", "sad", "dramatic", "gentle"]
CREATURES = ["a lonely robot", "a curious cat", "an old lighthouse keeper", "a dragon who is afraid of fire",
             "a lost balloon", "a talking tree", "a young astronaut", "a clever fox", "a snowman in spring",
             "a pirate who cannot swim", "a shy ghost", "a time traveller", "a bee who wants to sing"]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the largest element of a list",
    "counts the vowels in a string", "computes the factorial of n", "returns the n-th Fibonacci number",
    "removes duplicates from a list while keeping order", "checks whether a word is a palindrome",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "counts how often each word appears in a text",
    "finds the second smallest number in a list", "flattens a nested list", "computes the average of a list",
    "validates an email address with a simple rule", "sorts a list of names by length",
    "returns the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "reads a text file and prints its number of lines", "converts a binary string to an integer",
    "sums the digits of a number", "capitalizes the first letter of every word", "finds the missing number in 1..n",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go", "C++"]
CODE_CONCEPTS = ["a for loop", "a dictionary", "a class", "recursion", "a lambda function", "an exception",
                 "a pointer", "an array", "a hash table", "a linked list", "a stack", "a queue", "list comprehension",
                 "a variable", "a function", "an API", "a unit test", "version control", "a race condition"]

NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Keiko", "Liam", "Maya",
         "Noah", "Olga", "Pedro", "Rosa", "Sam", "Tara", "Victor"]
ITEMS = ["apples", "pencils", "books", "cookies", "stickers", "marbles", "oranges", "tickets", "cards", "stamps"]

SENTENCES = [
    "the meeting has been moved to thursday afternoon because the room was not available",
    "i think we should leave early so we can get good seats at the concert",
    "our team finished the project two days before the deadline",
    "the weather was terrible but we still enjoyed the picnic",
    "please remember to bring your own water bottle to the hike",
    "the new library opens next monday and everyone is invited",
    "he forgot his keys at the office and had to wait outside for an hour",
    "we are happy to announce that the shop will stay open later on fridays",
    "the cat knocked a glass off the table while we were eating dinner",
    "she has been learning the piano for three years and plays every evening",
    "the train was delayed by forty minutes due to a signal problem",
    "thank you for your help with the move last weekend",
    "the results of the survey show that most people prefer working in the morning",
    "our neighbours planted a small garden with tomatoes and herbs",
    "the software update fixes several bugs and makes the app faster",
]
REWRITES = ["Rewrite this sentence in a formal tone", "Make this sentence shorter", "Rewrite this sentence for a child",
            "Fix the capitalization and punctuation of this sentence", "Turn this sentence into a question",
            "Rewrite this sentence in the past tense", "Rewrite this sentence more politely",
            "Translate this sentence into simple English", "Rewrite this sentence in a friendly, casual tone"]
COPIES = ["Repeat this sentence exactly, then say how many words it has", "Write this sentence in all capital letters",
          "Copy this sentence and put each word on its own line", "Repeat this text twice",
          "Write this sentence backwards, word by word", "Put this sentence in quotation marks and repeat it",
          "Add a full stop to the end of this sentence and repeat it"]

CHATS = [
    "Hi! How are you today?", "Good morning! Can you tell me something interesting?", "I'm bored. Any ideas?",
    "Tell me a joke.", "What's your favourite book and why?", "I had a long day at work.",
    "Can you recommend a movie for a rainy evening?", "I just adopted a puppy!", "What should I cook tonight?",
    "Do you like music?", "I can't decide what to do this weekend.", "Tell me a fun fact about animals.",
    "I'm nervous about my exam tomorrow.", "What's a good hobby to start?", "Can you cheer me up?",
    "What would you do with a free day?", "I finished my first marathon!", "Say something nice.",
]


def _pick(rng, xs):
    return xs[rng.randrange(len(xs))]


def _qa(rng):
    s = _pick(rng, SUBJECTS)
    return _pick(rng, [f"What is {s}?", f"Who first studied {s}?", f"Why is {s} important?",
                       f"What are the main facts about {s}?", f"Where can I see {s} in everyday life?",
                       f"How old is the idea of {s}?", f"What is a common misconception about {s}?",
                       f"Give me a short answer: what is {s}?", f"What is the difference between {' and '.join(_pick(rng, PAIRS))}?",
                       f"What is the difference between {' and '.join(_pick(rng, PAIRS))}? Answer in one sentence."])


def _explain(rng):
    s = _pick(rng, SUBJECTS)
    t = _pick(rng, THINGS)
    return _pick(rng, [f"Explain {s} in simple terms.", f"Explain {s} to {_pick(rng, PEOPLE)}.",
                       f"How does {t} work?", f"Explain how {t} works in three sentences.",
                       f"Can you explain {s} like I'm five?", f"Explain the basic idea behind {s}.",
                       f"Why does {t} need electricity? Explain briefly.", f"Explain {s} in one paragraph."])


def _howto(rng):
    a = _pick(rng, ACTIVITIES)
    return _pick(rng, [f"How do I {a}?", f"What is the best way to {a}?", f"Give me step-by-step instructions to {a}.",
                       f"I want to {a}. Where should I start?", f"What mistakes should I avoid when I {a}?",
                       f"How can {_pick(rng, PEOPLE)} {a}?", f"Explain how to {a} in five steps."])


def _list(rng):
    n = _pick(rng, ["three", "four", "five", "six", "seven", "ten"])
    s, a = _pick(rng, SUBJECTS), _pick(rng, ACTIVITIES)
    return _pick(rng, [f"List {n} facts about {s}.", f"Give me {n} tips to {a}.", f"Name {n} uses of {_pick(rng, THINGS)}.",
                       f"List {n} advantages and disadvantages of {s}.", f"What are {n} things to know about {s}?",
                       f"Make a list of {n} books or films about {s}.", f"List {n} ways to {a} on a budget.",
                       f"Write a bulleted list of {n} questions a student might ask about {s}."])


def _creative(rng):
    f, m, c = _pick(rng, FORMS), _pick(rng, MOODS), _pick(rng, CREATURES)
    s = _pick(rng, SUBJECTS)
    return _pick(rng, [f"Write a {m} {f} about {c}.", f"Write a short {f} about {s}.", f"Write a {f} about {c}.",
                       f"Write a four-line {f} about {s}.", f"Tell me a short story about {c}.",
                       f"Write the opening paragraph of a {m} story about {c}.", f"Write a {m} {f} about {s}.",
                       f"Invent a name and a short backstory for {c}."])


def _code(rng):
    lang, task = _pick(rng, LANGUAGES), _pick(rng, CODE_TASKS)
    c = _pick(rng, CODE_CONCEPTS)
    return _pick(rng, [f"Write a {lang} function that {task}.", f"Write a {lang} function that {task}, with a comment.",
                       f"Show me {lang} code that {task}.", f"What is {c} in programming? Give an example in {lang}.",
                       f"Explain {c} with a short {lang} example.", f"How do I write a {lang} program that {task}?",
                       f"Write a short {lang} snippet that {task}, and explain it in one sentence."])


def _math(rng):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    n1, n2 = rng.sample(NAMES, 2)
    it = _pick(rng, ITEMS)
    return _pick(rng, [f"What is {a} + {b}?", f"What is {a} times {c}?", f"What is {a * c} divided by {c}?",
                       f"What is {c}% of {a * 10}?", f"{n1} has {a} {it} and gives {min(a, b) // 2} to {n2}. How many {it} does {n1} have left?",
                       f"{n1} buys {c} packs of {it} with {b} in each pack. How many {it} are there in total?",
                       f"A train travels {a * 10} km in {c} hours. What is its average speed?",
                       f"Solve for x: {c}x + {a} = {a + c * b}.", f"What is the square of {a}?",
                       f"Is {a * 2 + 1} a prime number? Explain.", f"Convert {a} kilometres to metres.",
                       f"{n1} is {a} years old and {n2} is {c} years older. How old is {n2}? Show your steps.",
                       f"What is the area of a rectangle {a} cm long and {c} cm wide?",
                       f"Round {a}.{b} to the nearest whole number.", f"What is {a} minus {b}?"])


def _rewrite(rng):
    return f"{_pick(rng, REWRITES)}: \"{_pick(rng, SENTENCES).capitalize()}.\""


def _copy(rng):
    k = rng.randint(1, 2)
    text = " ".join(s.capitalize() + "." for s in rng.sample(SENTENCES, k))
    return _pick(rng, [f"{_pick(rng, COPIES)}: {text}", f"{_pick(rng, COPIES)}:\n\n{text}",
                       f"Here is some text: \"{text}\" Please repeat it word for word.",
                       f"Summarize this in one sentence, then repeat the original: {text}"])


def _chat(rng):
    return _pick(rng, CHATS)


CATEGORIES = [("qa", _qa, 3), ("explain", _explain, 3), ("howto", _howto, 2), ("list", _list, 2),
              ("creative", _creative, 2), ("code", _code, 2), ("math", _math, 2), ("rewrite", _rewrite, 1),
              ("copy", _copy, 1), ("chat", _chat, 1)]


def generate(count: int, seed: int, kinds: list[str] | None = None) -> list[dict]:
    """`count` distinct prompts, categories drawn by their weights (among `kinds` when given);
    deterministic for `seed` (and `kinds`)."""
    rng = random.Random(seed)
    known = [c for c, _, _ in CATEGORIES]
    unknown = [k for k in kinds or [] if k not in known]
    if unknown:
        raise SystemExit(f"unknown kind {unknown[0]!r}: the kinds are {', '.join(known)}")
    names = [c for c, _, w in CATEGORIES for _ in range(w) if not kinds or c in kinds]
    fns = {c: f for c, f, _ in CATEGORIES}
    seen, out, tries = set(), [], 0
    while len(out) < count:
        tries += 1
        if tries > 50 * count + 1000:
            raise SystemExit(f"only {len(out)} distinct prompts after {tries} tries: ask for fewer")
        cat = _pick(rng, names)
        text = fns[cat](rng)
        if text in seen:
            continue
        seen.add(text)
        out.append({"id": f"p{len(out):05d}", "category": cat, "messages": [{"role": "user", "content": text}]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default="", help="comma-separated categories to draw from (default: all, by weight)")
    p.add_argument("--exclude", nargs="*", default=[],
                   help="prompt files (JSON lines) whose user turns are left out, kept out of training (held-out sets)")
    args = p.parse_args(argv)
    if args.count < 1:
        raise SystemExit("--count must be >= 1")
    held_out = set()
    for path in args.exclude:
        with open(path) as f:
            held_out.update(m["content"] for line in f if line.strip() for m in json.loads(line)["messages"] if m["role"] == "user")
    rows = [r for r in generate(args.count, args.seed, [k for k in args.kinds.split(",") if k] or None)
            if r["messages"][0]["content"] not in held_out]
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} prompts to {args.out} ({args.count - len(rows)} left out)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
