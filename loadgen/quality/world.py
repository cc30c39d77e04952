"""A small invented world whose facts the answer-quality workload asks about.

Four kinds of entity, all with made-up names (so a model cannot answer from what it
learnt in training, only from the passages): rivers, towns, people and mountains. Each
entity is written up as one passage of two or three templated sentences; every fact a
passage states is recorded as a `(entity, attribute)` key, so which passages hold a
question's answer is known exactly. Deterministic in the seed (`loadgen.workloads.sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ONSETS = (
    "b",
    "br",
    "c",
    "d",
    "dr",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "w",
    "z",
    "th",
    "gl",
    "sk",
)
VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
CODAS = ("", "n", "r", "l", "s", "th", "m", "nd", "rn", "sk", "ll")
DIRECTIONS = ("north", "south", "east", "west")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
GOODS = (
    "cheese",
    "wool",
    "pottery",
    "glass",
    "honey",
    "salt",
    "cider",
    "lace",
    "timber",
    "copper",
    "linen",
    "apples",
    "bread",
    "rope",
    "leather",
    "silver",
)
JOBS = (
    "baker",
    "doctor",
    "teacher",
    "sailor",
    "painter",
    "carpenter",
    "miller",
    "judge",
    "printer",
    "weaver",
    "surveyor",
    "librarian",
    "blacksmith",
    "architect",
    "brewer",
)
WORKS = (
    "a bridge over the harbour",
    "a book of local songs",
    "a map of the coast",
    "a school for girls",
    "a clock in the town hall",
    "a cure for marsh fever",
    "a ship that sailed to the islands",
    "a garden of rare roses",
    "a survey of the old roads",
    "a painting of the market square",
)


@dataclass(frozen=True)
class Fact:
    """One question a passage can answer: the question text and its reference answers."""

    key: tuple[str, str]  # (entity, attribute)
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Passage:
    """One document: its text, the facts it states, and the questions asked about it."""

    id: str
    text: str
    states: frozenset[tuple[str, str]]
    questions: tuple[Fact, ...]


class NameMaker:
    """Unique, pronounceable, invented names (two syllables, capitalised)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _syllable(self) -> str:
        pick = self.rng.choice
        return str(pick(ONSETS)) + str(pick(VOWELS)) + str(pick(CODAS))

    def make(self) -> str:
        while True:
            name = (self._syllable() + self._syllable()).capitalize()
            if 4 <= len(name) <= 10 and name not in self.used:
                self.used.add(name)
                return name


def build_world(
    rng: np.random.Generator, rivers: int, towns: int, people: int, mountains: int
) -> list[Passage]:
    """The passages of one world, rivers first, then towns, people and mountains.

    Every town lies on a river; a river's passage names its first three towns, so "On
    which river does the town of T lie?" is answered by T's passage and, for those towns,
    by the river's too (the workload's questions with two answer-bearing passages)."""
    if min(rivers, towns, people, mountains) < 1:
        raise ValueError("every kind of entity needs at least one")
    names = NameMaker(rng)
    hills = [names.make() for _ in range(max(1, rivers // 2))]
    seas = [names.make() for _ in range(max(2, rivers // 4))]
    river_names = [names.make() for _ in range(rivers)]
    town_names = [names.make() for _ in range(towns)]
    town_river = [river_names[int(rng.integers(rivers))] for _ in range(towns)]

    passages: list[Passage] = []
    for river in river_names:
        hill, sea = str(rng.choice(hills)), str(rng.choice(seas))
        length = int(rng.integers(3, 60)) * 5
        direction = str(rng.choice(DIRECTIONS))
        banks = [t for t, r in zip(town_names, town_river, strict=True) if r == river][:3]
        text = (
            f"The river {river} rises in the {hill} hills and flows {direction} for "
            f"{length} kilometres before it empties into the {sea} Sea."
        )
        states = {(river, "sea"), (river, "length"), (river, "source")}
        if banks:
            text += " Towns along its banks include " + " and ".join(banks) + "."
            states |= {(town, "river") for town in banks}
        passages.append(
            Passage(
                id=f"river-{river.lower()}",
                text=text,
                states=frozenset(states),
                questions=(
                    Fact(
                        (river, "sea"),
                        f"Into which sea does the river {river} flow?",
                        (f"{sea} Sea", f"the {sea} Sea"),
                    ),
                    Fact(
                        (river, "length"),
                        f"How long is the river {river}?",
                        (f"{length} kilometres", f"{length} km"),
                    ),
                    Fact(
                        (river, "source"),
                        f"In which hills does the river {river} rise?",
                        (f"{hill} hills", f"the {hill} hills"),
                    ),
                ),
            )
        )
    for town, river in zip(town_names, town_river, strict=True):
        people_count = int(rng.integers(2, 90)) * 100
        day, good = str(rng.choice(DAYS)), str(rng.choice(GOODS))
        passages.append(
            Passage(
                id=f"town-{town.lower()}",
                text=(
                    f"The town of {town} lies on the river {river}. About {people_count} "
                    f"people live there. Its market is held every {day}, and the town is "
                    f"known for its {good}."
                ),
                states=frozenset(
                    {(town, "river"), (town, "population"), (town, "market"), (town, "goods")}
                ),
                questions=(
                    Fact(
                        (town, "river"),
                        f"On which river does the town of {town} lie?",
                        (river, f"the river {river}"),
                    ),
                    Fact(
                        (town, "population"),
                        f"How many people live in {town}?",
                        (f"about {people_count}", str(people_count)),
                    ),
                    Fact(
                        (town, "market"),
                        f"On which day is the market of {town} held?",
                        (day, f"every {day}"),
                    ),
                    Fact(
                        (town, "goods"),
                        f"What is the town of {town} known for?",
                        (good, f"its {good}"),
                    ),
                ),
            )
        )
    for _ in range(people):
        first, last = names.make(), names.make()
        person = f"{first} {last}"
        town = str(rng.choice(town_names))
        year = int(rng.integers(1700, 1950))
        job, work = str(rng.choice(JOBS)), str(rng.choice(WORKS))
        pronoun = "She" if rng.random() < 0.5 else "He"
        passages.append(
            Passage(
                id=f"person-{first.lower()}-{last.lower()}",
                text=(
                    f"{person} was born in {town} in {year}. {pronoun} worked as a {job} "
                    f"and is best remembered for {work}."
                ),
                states=frozenset({(person, "born_year"), (person, "born_town"), (person, "job")}),
                questions=(
                    Fact(
                        (person, "born_year"),
                        f"In which year was {person} born?",
                        (str(year), f"in {year}"),
                    ),
                    Fact(
                        (person, "born_town"),
                        f"In which town was {person} born?",
                        (town, f"in {town}"),
                    ),
                    Fact((person, "job"), f"What did {person} work as?", (job, f"a {job}")),
                ),
            )
        )
    for _ in range(mountains):
        mountain, climber = names.make(), f"{names.make()} {names.make()}"
        hill = str(rng.choice(hills))
        height = int(rng.integers(300, 2400))
        year = int(rng.integers(1750, 1960))
        passages.append(
            Passage(
                id=f"mountain-{mountain.lower()}",
                text=(
                    f"Mount {mountain} is the highest point of the {hill} hills. It is "
                    f"{height} metres high and was first climbed in {year} by {climber}."
                ),
                states=frozenset({(mountain, "height"), (mountain, "first_climbed")}),
                questions=(
                    Fact(
                        (mountain, "height"),
                        f"How high is Mount {mountain}?",
                        (f"{height} metres", f"{height} m"),
                    ),
                    Fact(
                        (mountain, "first_climbed"),
                        f"In which year was Mount {mountain} first climbed?",
                        (str(year), f"in {year}"),
                    ),
                ),
            )
        )
    return passages
