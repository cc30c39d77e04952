"""The ``builtin`` tokenizer: small, deterministic, built locally (issue 2, item 4).

A byte-level BPE (vocab 8192) trained with the ``tokenizers`` library on a corpus that
this module generates from a fixed seed, with ChatML special tokens and a Qwen-like
ChatML chat template. It stands in for a served model's tokenizer in the tests, the demo
and the simulated engine; its granularity is realistic for English-like text (about one
token per 4 characters).

The result is cached on disk as ``tokenizer.json`` + ``tokenizer_config.json`` (a model
directory, loadable like any other) under ``<cache>/tokenizers/builtin-<version>/``.
Two processes may build it at once: each builds in its own temporary directory and
renames it into place atomically; the loser keeps the winner's copy.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

BUILTIN_VERSION = "1"
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS_SEED = 20260417
CORPUS_SENTENCES = 40_000
RARE_WORD_RATE = 0.25

# Qwen-style ChatML (as Qwen3-4B-Instruct-2507, without tool calling): no default system
# message, generation prompt opens the assistant turn.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state keep eye never
last let thought city tree cross farm hard start might story saw far sea draw left late run
while press close night real life few north open seem together next white children begin got
walk example ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain stop once
base hear horse cut sure watch color face wood main enough plain girl usual young ready above
ever red list though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half rock order fire
south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit
power town fine certain fly fall lead cry dark machine note wait plan figure star box noun
field rest correct able pound done beauty drive stood contain front teach week final gave
green quick develop ocean warm free minute strong special mind behind clear tail produce fact
street inch multiply nothing course stay wheel full force blue object decide surface deep moon
island foot system busy test record boat common gold possible plane stead dry wonder laugh
thousand ago ran check game shape equate miss brought heat snow tire bring yes distant fill
east paint language among grand ball yet wave drop heart present heavy dance engine position
arm wide sail material size vary settle speak weight general ice matter circle pair include
divide syllable felt perhaps pick sudden count square reason length represent art subject
region energy hunt probable bed brother egg ride cell believe fraction forest sit race window
store summer train sleep prove lone exercise wall catch mount wish sky board joy winter sat
written wild instrument kept glass grass cow job edge sign visit past soft fun bright gas
weather month million bear finish happy hope flower clothe strange gone jump baby eight village
meet root buy raise solve metal whether push seven paragraph third shall held hair describe
cook floor either result burn hill safe cat century consider type law bit coast copy phrase
silent tall sand soil roll temperature finger industry value fight lie beat excite natural
view sense ear else quite broke case middle kill son lake moment scale loud spring observe
child straight consonant nation dictionary milk speed method organ pay age section dress cloud
surprise quiet stone tiny climb cool design poor lot experiment bottom key iron single stick
flat twenty skin smile crease hole trade melody trip office receive row mouth exact symbol die
least trouble shout except wrote seed tone join suggest clean break lady yard rise bad blow
oil blood touch grew cent mix team wire cost lost brown wear garden equal sent choose fell fit
flow fair bank collect save control decimal gentle woman captain practice separate difficult
doctor please protect noon whose locate ring character insect caught period indicate radio
spoke atom human history effect electric expect crop modern element hit student corner party
supply bone rail imagine provide agree thus capital chair danger fruit rich thick soldier
process operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare
poem string bell depend meat rub tube famous dollar stream fear sight thin triangle planet
hurry chief colony clock mine tie enter major fresh search send yellow gun allow print dead
spot desert suit current lift rose continue block chart hat sell success company subtract
event particular deal swim term opposite wife shoe shoulder spread arrange camp invent cotton
born determine quart nine truck noise level chance gather shop stretch throw shine property
column molecule select wrong gray repeat require broad prepare salt nose plural anger claim
continent oxygen sugar death pretty skill women season solution magnet silver thank branch
match suffix especially fig afraid huge sister steel discuss forward similar guide experience
score apple bought led pitch coat mass card band rope slip win dream evening condition feed
tool total basic smell valley nor double seat arrive master track parent shore division sheet
substance favor connect post spend chord fat glad original share station dad bread charge
proper bar offer segment slave duck instant market degree populate chick dear enemy reply drink
occur support speech nature range steam motion path liquid log meant quotient teeth shell neck
data model server request cache token memory query answer document policy flight booking
customer order payment refund account user agent tool schedule network latency throughput
information government development international community important following national
business service research education president student program problem company question
available different performance application management technology environment according
experience including relationship understanding organization particularly significant
production population political economic social physical financial professional general
individual increase decrease remain across within without however therefore although
because another whether various several certain provide consider require describe receive
continue include involve improve reduce produce maintain establish determine identify
function structure analysis process practice activity property authority industry history
knowledge language literature instance evidence difference influence response resource
quality quantity security strategy technique opportunity responsibility ability capacity
directly recently especially actually probably usually finally simply clearly generally
original natural central current recent similar specific standard complex simple various
approach benefit challenge concept context decision element feature framework measure
method network object option pattern period position principle purpose source version
traditional additional potential material medical legal federal private public personal
"""

_PUNCT = (".", ".", ".", ",", ",", ";", ":", "?", "!")


class _WordShapes:
    """An order-2 character Markov chain over the word list: invents English-looking
    words so that the BPE learns English sub-word units, not only whole words."""

    def __init__(self, words: list[str]) -> None:
        counts: dict[str, dict[str, int]] = {}
        for word in words:
            padded = "^^" + word.lower() + "$"
            for i in range(2, len(padded)):
                nxt = counts.setdefault(padded[i - 2 : i], {})
                nxt[padded[i]] = nxt.get(padded[i], 0) + 1
        self._table = {
            ctx: (sorted(nxt), [nxt[c] for c in sorted(nxt)]) for ctx, nxt in counts.items()
        }

    def word(self, rng: random.Random) -> str:
        out = "^^"
        while len(out) < 16:
            chars, weights = self._table[out[-2:]]
            ch = rng.choices(chars, weights=weights)[0]
            if ch == "$":
                break
            out += ch
        return out[2:] or "a"


def _sentence(
    rng: random.Random, words: list[str], weights: list[float], shapes: _WordShapes
) -> str:
    n = rng.randint(5, 22)
    out = rng.choices(words, weights=weights, k=n)
    for i in range(n):
        roll = rng.random()
        if roll < RARE_WORD_RATE:
            out[i] = shapes.word(rng)
        elif roll < RARE_WORD_RATE + 0.02:
            out[i] = str(rng.randint(0, 2100))
        elif roll < RARE_WORD_RATE + 0.06:
            out[i] = out[i] + rng.choice(("s", "ed", "ing", "ly", "er", "tion"))
        if rng.random() < 0.05:
            out[i] = out[i] + ","
    out[0] = out[0].capitalize()
    if rng.random() < 0.1:
        out[rng.randrange(n)] = shapes.word(rng).capitalize()
    return " ".join(out) + rng.choice(_PUNCT)


def corpus(seed: int = CORPUS_SEED, sentences: int = CORPUS_SENTENCES) -> Iterator[str]:
    """Yield the deterministic training corpus: paragraphs of Zipf-weighted English words,
    inflections, invented words, numbers and punctuation (same bytes on every machine)."""
    rng = random.Random(seed)
    words = _WORDS.split()
    weights = [1.0 / (rank + 10) for rank in range(len(words))]
    shapes = _WordShapes(words)
    done = 0
    while done < sentences:
        k = rng.randint(1, 6)
        para = " ".join(_sentence(rng, words, weights, shapes) for _ in range(k))
        yield para + rng.choice(("\n", "\n\n", " "))
        done += k


def train_builtin() -> HFTokenizer:
    """Train the builtin byte-level BPE from the generated corpus (a few seconds)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def builtin_config() -> dict[str, object]:
    """The ``tokenizer_config.json`` written next to the builtin ``tokenizer.json``."""
    return {
        "tokenizer_class": "PrismBuiltinTokenizer",
        "builtin_version": BUILTIN_VERSION,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
    }


def write_builtin(directory: Path) -> None:
    """Build the builtin tokenizer into ``directory`` (created, must not hold one yet)."""
    directory.mkdir(parents=True, exist_ok=True)
    train_builtin().save(str(directory / "tokenizer.json"), pretty=False)
    config = json.dumps(builtin_config(), indent=2, sort_keys=True) + "\n"
    (directory / "tokenizer_config.json").write_text(config, encoding="utf-8")


def ensure_builtin(cache_root: Path) -> Path:
    """Return the builtin tokenizer's model directory under ``cache_root``, building it
    first if absent. Safe against concurrent builders (temp dir + atomic rename)."""
    final = cache_root / "tokenizers" / f"builtin-{BUILTIN_VERSION}"
    if (final / "tokenizer_config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".builtin-{BUILTIN_VERSION}-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        write_builtin(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process won the race (final exists, non-empty): use its copy.
            if not (final / "tokenizer_config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
