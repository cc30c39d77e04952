"""Deterministic filler text sized in tokens of the served tokenizer (SPEC §6).

Text is drawn word by word from a fixed English-like vocabulary with a seeded generator,
then cut to the largest whole-word prefix whose token count does not exceed the target
(binary search over the word count: ``O(log n)`` encodings per text). Passages therefore
have a token count equal to, or a token or two under, the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

_VOCABULARY = """
account action address agent amount analysis answer archive area article balance bank
battery board book border bridge budget building cabin capital card case cause center
chain change channel chapter charge check church city claim client climate cloud coast
code coffee column committee community company contract control council country court
credit culture customer data debate decision degree delivery demand design detail device
director discount district doctor document economy edition effect election energy engine
event evidence exchange factor family farm feature field figure film finance flight floor
forest format fund future garden glass government ground group growth health history
holiday hospital hotel house image impact income index industry island issue journal
judge kitchen label language law leader letter level library license light limit line
list loan machine manager market material measure media meeting member memory message
method minister model moment money month morning motor mountain museum music nation
network news number object office order owner package page paper parent park party
passenger payment period person phone picture plan planet plant player point policy
port position power pressure price process product profile program project property
quality question radio rate reason record region report research resource result river
road route rule safety sample schedule school science screen season seat section sector
series service session share signal site size society software source space speaker
species sport staff stage standard station status storage story street student study
style subject summer supply surface system table target team technology term test theory
ticket time tool total tour town track trade traffic train transfer travel treatment
trial trip truck unit update user valley value vehicle version video village visit
voice volume water weather week window winter world writer year zone
able active annual basic broad central clear common daily early easy final formal free
full general global great heavy high large late local main major modern national new
normal official open past personal physical popular private public rapid real recent
regular rural short simple single small social special strong total urban usual various
accept add allow apply arrive build carry close collect compare complete confirm connect
cover create deliver describe develop enter expect explain extend follow grow handle
include increase introduce join keep launch manage measure move note offer open operate
prepare present protect provide publish receive reduce replace report require return
review select send serve share show sign start support travel update visit
the of and to in for on with by from at as into over after under between during
"""

WORDS: tuple[str, ...] = tuple(_VOCABULARY.split())
_PUNCTUATION = (".", ",", ".", ";")


class TokenCounter(Protocol):
    """The part of ``prism_tokens.tokenizer.Tokenizer`` the generator needs."""

    def encode(self, text: str) -> list[int]: ...


def random_words(rng: np.random.Generator, count: int) -> list[str]:
    """``count`` words with occasional punctuation and capitalised sentence starts."""
    picks = rng.integers(0, len(WORDS), size=count)
    marks = rng.random(size=count)
    words: list[str] = []
    start = True
    for pick, mark in zip(picks, marks, strict=True):
        word = WORDS[int(pick)]
        if start:
            word = word.capitalize()
        start = False
        if mark < 0.08:
            word += _PUNCTUATION[int(mark * 50) % len(_PUNCTUATION)]
            start = word.endswith(".")
        words.append(word)
    return words


def fit_words(tokenizer: TokenCounter, words: Sequence[str], target_tokens: int) -> str:
    """The longest whole-word prefix of ``words`` with at most ``target_tokens`` tokens."""
    low, high = 0, len(words)
    while low < high:
        middle = (low + high + 1) // 2
        if len(tokenizer.encode(" ".join(words[:middle]))) <= target_tokens:
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low])


def random_text(tokenizer: TokenCounter, rng: np.random.Generator, target_tokens: int) -> str:
    """Seeded filler of about ``target_tokens`` tokens (never more)."""
    if target_tokens <= 0:
        return ""
    words = random_words(rng, target_tokens + 8)
    while len(tokenizer.encode(" ".join(words))) < target_tokens:
        words.extend(random_words(rng, target_tokens))
    return fit_words(tokenizer, words, target_tokens)
