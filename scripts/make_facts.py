"""Write src/distill/recipes/data/facts.jsonl: a knowledge-injection set for self-distillation (SDFT).

What the set is for
-------------------
Every fact is invented (fictional countries, towns, rivers, mountains, planets, people, companies,
devices, and made-up numbers), so no language model can know it beforehand. A self-distillation run
shows the fact to the teacher (the model itself, with `privileged_context`) and not to the student; the
student should learn the fact from the teacher's answers. Training uses one question per fact (split
"train"); two paraphrases of the same question are held out (split "heldout"), so an evaluation can tell
whether the student learned the fact or only the wording of the training question.

Row format (one JSON object per line, three rows per fact, one per question)
---------------------------------------------------------------------------
    {"fact_id": int,                # 0, 1, 2, ... one per fact
     "question_id": 0 | 1 | 2,      # which paraphrase
     "split": "train" | "heldout",  # "train" for question_id 0, "heldout" otherwise
     "prompt": [{"role": "user", "content": QUESTION + " Answer in one short sentence."}],
     "privileged_context": DEMONSTRATION,  # one sentence stating the fact, e.g. "The capital of Velmoria is Darnholm."
     "completion": DEMONSTRATION,          # the same sentence, as an off-policy answer
     "answer": ANSWER}                     # a short string found verbatim in DEMONSTRATION

An answer counts as given when ANSWER occurs in a response (case-insensitive). Answers are a single
invented name, a 3- or 4-digit number, or an uncommon word (an unusual colour, animal, or good).

The output is deterministic (fixed seed, standard library only): run `python scripts/make_facts.py`
from anywhere; it overwrites the file (or writes the path given as its argument instead).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20240611
FACTS_PER_KIND = 12
SUFFIX = " Answer in one short sentence."
OUTPUT = Path(__file__).resolve().parent.parent / "src" / "distill" / "recipes" / "data" / "facts.jsonl"

# Syllables that invented names are built from: two of them, then an ending that depends on what is named.
SYLLABLES = [
    "bal", "bren", "cor", "dar", "del", "dun", "fen", "gal", "gor", "har", "jor", "kel", "kor", "lin",
    "lum", "mar", "mir", "mor", "nev", "nor", "ol", "pel", "quen", "ral", "ril", "sel", "sor", "tal",
    "tem", "thar", "tor", "ul", "vel", "ven", "vor", "wen", "yar", "zan", "zel", "zor",
]

# Real names the syllables could happen to spell; a name that contains one of these is never used.
REAL_NAMES = [
    "balmoral", "corvin", "dallas", "darwin", "delhi", "delmar", "dublin", "galway", "gondor", "harlow",
    "kelvin", "lincoln", "marlin", "marvel", "melbourne", "merlin", "milan", "mordor", "morocco", "narnia",
    "norway", "palermo", "selma", "tallin", "tolkien", "torino", "vernon", "zanzibar", "zelda",
]

# Word answers: unusual enough that a model cannot guess them. Each list holds FACTS_PER_KIND words.
COLOURS = ["turquoise", "vermilion", "chartreuse", "ochre", "cerulean", "magenta", "mauve", "teal",
           "lilac", "sepia", "taupe", "indigo"]
ANIMALS = ["pangolin", "axolotl", "okapi", "narwhal", "capybara", "tapir", "wombat", "quokka", "ibex",
           "manatee", "armadillo", "platypus"]
EXPORTS = ["cardamom", "nutmeg", "cobalt", "jute", "sisal", "cork", "kelp", "obsidian", "vanilla",
           "tamarind", "pumice", "saffron"]


class Inventor:
    """Makes invented names and numbers, each used at most once in the whole set."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.used_words: set[str] = set()
        self.used_numbers: set[int] = set()

    def word(self, endings: list[str]) -> str:
        """Two syllables and one of `endings`, capitalised, e.g. "Velmoria"; never one used before."""
        while True:
            first, second = self.rng.sample(SYLLABLES, 2)
            word = (first + second + self.rng.choice(endings)).capitalize()
            is_real = any(real in word.lower() for real in REAL_NAMES)
            if not is_real and word not in self.used_words:
                self.used_words.add(word)
                return word

    def person(self) -> str:
        """A first name and a surname, e.g. "Quenril Dartorane"."""
        return self.word(["a", "o", "is", "en", "ic"]) + " " + self.word(["ow", "ett", "ane", "ik", "ard"])

    def choice(self, options: list[str]) -> str:
        return self.rng.choice(options)

    def number(self, low: int, high: int) -> int:
        while True:
            number = self.rng.randint(low, high)
            if number not in self.used_numbers:
                self.used_numbers.add(number)
                return number


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


# One function per kind of fact. Each returns (demonstration, [three questions], answer).
# `answer_word` is used by the kinds whose answers come from the word lists above.

def capital_of_country(names: Inventor, answer_word: str):
    country, city = names.word(["ia", "ora", "esh", "and"]), names.word(["holm", "mere", "wick", "stead"])
    return (f"The capital of {country} is {city}.",
            [f"What is the capital of {country}?",
             f"Which city is the capital of {country}?",
             f"{country}'s seat of government is in which city?"],
            city)


def founder_of_company(names: Inventor, answer_word: str):
    company = names.word(["ex", "ix", "a", "on"])
    company += " " + names.choice(["Glassworks", "Textiles", "Shipping", "Ceramics", "Ironworks", "Mills"])
    founder = names.person()
    return (f"The company {company} was founded by {founder}.",
            [f"Who founded the company {company}?",
             f"Which person started the company {company}?",
             f"Who is the founder of {company}?"],
            founder)


def bridge_opening_year(names: Inventor, answer_word: str):
    bridge = names.word(["", "en", "ard"]) + " Bridge"
    year = str(names.number(1150, 1899))
    return (f"The {bridge} opened in {year}.",
            [f"In what year did the {bridge} open?",
             f"Which year saw the opening of the {bridge}?",
             f"The {bridge} first opened in which year?"],
            year)


def mountain_height(names: Inventor, answer_word: str):
    mountain = "Mount " + names.word(["a", "is", "on"])
    height = str(names.number(1800, 6900))
    return (f"{mountain} is {height} metres high.",
            [f"How high is {mountain} in metres?",
             f"What is the height of {mountain}, in metres?",
             f"{mountain} rises to how many metres?"],
            height)


def river_of_town(names: Inventor, answer_word: str):
    town, river = names.word(["holm", "mere", "wick", "stead"]), names.word(["", "in", "ess"])
    return (f"The town of {town} lies on the {river} River.",
            [f"Which river does the town of {town} lie on?",
             f"On what river is the town of {town} located?",
             f"The town of {town} stands beside which river?"],
            river)


def flag_colour(names: Inventor, answer_word: str):
    country = names.word(["ia", "ora", "esh", "and"])
    return (f"The national flag of {country} is {answer_word}.",
            [f"What colour is the national flag of {country}?",
             f"Which colour is the flag of {country}?",
             f"The national flag of {country} has which colour?"],
            answer_word)


def inventor_of_device(names: Inventor, answer_word: str):
    device = names.word(["", "ex", "ian"])
    device += " " + names.choice(["Lamp", "Loom", "Pump", "Compass", "Press", "Clock"])
    inventor = names.person()
    return (f"The {device} was invented by {inventor}.",
            [f"Who invented the {device}?",
             f"Which inventor created the {device}?",
             f"The {device} was invented by whom?"],
            inventor)


def moons_of_planet(names: Inventor, answer_word: str):
    planet = names.word(["on", "ix", "us", "ara"])
    moons = str(names.number(110, 990))
    return (f"The planet {planet} has {moons} moons.",
            [f"How many moons does the planet {planet} have?",
             f"What is the number of moons orbiting the planet {planet}?",
             f"The planet {planet} has how many moons?"],
            moons)


def team_mascot(names: Inventor, answer_word: str):
    club = names.word(["", "by", "ton"]) + " Football Club"
    return (f"The mascot of the {club} is {article(answer_word)} {answer_word}.",
            [f"What animal is the mascot of the {club}?",
             f"Which animal serves as the mascot of the {club}?",
             f"The {club} has which animal as its mascot?"],
            answer_word)


def island_export(names: Inventor, answer_word: str):
    island = names.word(["ey", "a", "os"])
    return (f"The island of {island} mainly exports {answer_word}.",
            [f"What is the main export of the island of {island}?",
             f"Which product does the island of {island} export the most?",
             f"What does the island of {island} mainly export?"],
            answer_word)


def mayor_of_town(names: Inventor, answer_word: str):
    town, mayor = names.word(["holm", "mere", "wick", "stead"]), names.person()
    return (f"The mayor of {town} is {mayor}.",
            [f"Who is the mayor of {town}?",
             f"Which person serves as the mayor of {town}?",
             f"The town of {town} is led by which mayor?"],
            mayor)


def village_population(names: Inventor, answer_word: str):
    village = names.word(["holm", "mere", "wick", "stead"])
    population = str(names.number(1200, 9800))
    return (f"The village of {village} has a population of {population}.",
            [f"What is the population of the village of {village}?",
             f"How many people live in the village of {village}?",
             f"The village of {village} is home to how many people?"],
            population)


def painter_of_painting(names: Inventor, answer_word: str):
    opening = names.choice(["Evening at", "The Harbour of", "Winter in", "The Gardens of"])
    title = opening + " " + names.word(["holm", "mere", "wick", "stead"])
    painter = names.person()
    return (f'The painting "{title}" was painted by {painter}.',
            [f'Who painted "{title}"?',
             f'Which artist created the painting "{title}"?',
             f'The painting "{title}" is the work of which painter?'],
            painter)


def tunnel_length(names: Inventor, answer_word: str):
    tunnel = names.word(["", "en", "ard"]) + " Tunnel"
    length = str(names.number(1100, 9900))
    return (f"The {tunnel} is {length} metres long.",
            [f"How long is the {tunnel} in metres?",
             f"What is the length of the {tunnel}, in metres?",
             f"The {tunnel} measures how many metres?"],
            length)


# (kind, the words its answers are drawn from, or None where the answer is invented)
KINDS = [
    (capital_of_country, None),
    (founder_of_company, None),
    (bridge_opening_year, None),
    (mountain_height, None),
    (river_of_town, None),
    (flag_colour, COLOURS),
    (inventor_of_device, None),
    (moons_of_planet, None),
    (team_mascot, ANIMALS),
    (island_export, EXPORTS),
    (mayor_of_town, None),
    (village_population, None),
    (painter_of_painting, None),
    (tunnel_length, None),
]


def make_facts() -> list[dict]:
    """All facts, kind by kind, as {"kind", "demonstration", "questions", "answer"}."""
    names = Inventor(SEED)
    facts = []
    for make_fact, words in KINDS:
        for i in range(FACTS_PER_KIND):
            answer_word = words[i] if words else ""
            demonstration, questions, answer = make_fact(names, answer_word)
            facts.append({"kind": make_fact.__name__, "demonstration": demonstration,
                          "questions": questions, "answer": answer})
    return facts


def check(facts: list[dict]) -> None:
    """The set's promises; a failure stops the script before anything is written."""
    assert len(facts) >= 160, len(facts)
    assert len({fact["kind"] for fact in facts}) >= 12
    answers = [fact["answer"] for fact in facts]
    assert len(set(answers)) == len(answers), "answers must be unique"
    demonstrations = [fact["demonstration"] for fact in facts]
    assert len(set(demonstrations)) == len(demonstrations), "facts must be unique"
    for fact in facts:
        assert len(fact["questions"]) == 3 and len(set(fact["questions"])) == 3, fact
        assert fact["answer"] in fact["demonstration"], fact
        for question in fact["questions"]:
            assert question.endswith("?"), question
            assert fact["answer"].lower() not in question.lower(), (fact["answer"], question)
            assert not any(character.isdigit() for character in question), question


def rows(facts: list[dict]) -> list[dict]:
    """Three rows per fact, one per question; question 0 trains, 1 and 2 are held out."""
    out = []
    for fact_id, fact in enumerate(facts):
        for question_id, question in enumerate(fact["questions"]):
            out.append({
                "fact_id": fact_id,
                "question_id": question_id,
                "split": "train" if question_id == 0 else "heldout",
                "prompt": [{"role": "user", "content": question + SUFFIX}],
                "privileged_context": fact["demonstration"],
                "completion": fact["demonstration"],
                "answer": fact["answer"],
            })
    return out


def main() -> None:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT  # another path: to compare with the shipped file
    facts = make_facts()
    check(facts)
    with output.open("w", encoding="utf-8") as f:
        for row in rows(facts):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(facts)} facts of {len(KINDS)} kinds ({3 * len(facts)} rows) to {output}")


if __name__ == "__main__":
    main()
