"""The builtin tokenizer's training corpus, generated from a fixed seed.

Paragraphs of English words drawn with Zipf-like weights, plus what real prompts carry
and a BPE must learn pieces for: inflections, invented English-looking words (an
order-2 character Markov chain over the word list), acronyms, numbers, hyphenated
compounds, parentheses and quotes, markdown bullets and headings, and JSON fragments
like tool schemas. Only Python's ``random.Random`` (stable across platforms and
versions for the calls used here) drives it, so the text is the same on every machine.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator

CORPUS_SEED = 20260417
CORPUS_PARAGRAPHS = 12_000

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
able about above accept access accident account achieve acquire across action active actual
address adjust admit adopt adult advance advantage advice affect afford afternoon against
agency agenda aircraft airline airport alarm album alive allocate alone along already alter
amount analyse ancient angle annual anxious apart apparent appeal apply appoint approve
argue arise army arrest article artist aside aspect assess asset assign assist assume attach
attack attempt attend attention attitude attract audience author automatic average avoid
award aware balance barrier battle beach beyond bill birth blame blank bless board bonus
border borrow boss bother bottle brain brand brief bridge broadcast budget burden button
cabin calculate campaign cancel candidate cannot capture career careful category celebrate
certainly chain champion channel chapter chemical choice church circumstance citizen civil
climate clinic closely coach code coffee collapse college combine comfort command comment
commercial commission commit committee communicate compete complain component compute
concern conclude conduct conference confirm conflict congress connection conscious
consequence conservative constant construct consumer contact content contract contribute
convention conversation convert convince corporate council counter couple courage court
crime crisis criteria critical cultural culture customer cycle daily damage database deadline
debate decade declare decline default defend define definitely deliver demand democracy
department departure deposit depth deputy derive deserve desire despite destination detail
detect device dialogue diet digital dimension dinner director discover discount disease
display distance distinct district document domestic dominant double draft dramatic
economy edition editor effective efficient effort either elect election electronic email
emerge emotion emphasis employee employer enable encounter encourage engage enhance enjoy
ensure entire entry episode equipment error escape essential estate estimate evaluate
eventually evidence exactly examine excellent exchange exclude executive exist expand
expense expert explain explore export express extend external extra extreme facility factor
failure fairly faith false familiar fashion feature fee festival file film finance finding
firm fiscal flexible focus former formula fortune forum foundation frequency fully fund
further future gain gallery gap gender generate generation global goal grade graduate grant
guarantee guest handle hardware health heavily highlight hire holiday honest hospital host
household housing identity ignore illness image immediate impact implement imply impose
income independent index indicate initial injury input inside insist install institution
insurance intelligence intend internal internet interview introduce invest investigate
invite issue item itself journey judge justice label labour landscape largely launch layer
leader league lecture legacy length lesson license limit limited link loan local location
logic luggage maintain majority manage manager manner manual margin marriage massive maximum
meanwhile media member membership mention message middle minimum minister minority mission
mobile modify monitor mostly motor movement multiple mutual narrative negative neither
normal notion novel numerous obtain obvious occasion offer officer official online operation
opinion oppose option orange outcome output overall owner package panel parallel partner
passenger passport patient payment peace penalty pension percent perfect perform permit
phase phone physician platform player plenty pocket police portion positive possess predict
prefer premium presence preserve pressure prevent previous price primary prime prior
priority prison procedure proceed profile profit progress project promise promote prompt
proposal protection protest publish purchase pursue qualify range rapid rarely rate ratio
reader reality realize receipt recognize recommend recover reduction refer reflect reform
refuse regard register regular reject relate release relevant reliable religion remove
repair replace report request rescue reservation reserve resident resolve respect respond
restaurant restore restrict retail retain retire return reveal revenue review reward risk
role route routine safety salary sample satisfy saving scene scheme scope screen seat
secret sector secure segment senior sequence series session severe shift shipping signal
significant silence site situation slightly software soldier somebody somewhat sort speaker
spirit sponsor staff stage status steady storage strategy stress strike structure studio
style submit subsequent succeed sufficient suggest summary supplier suppose survey survive
suspect sustain switch target task tax teacher temporary tend tension terminal territory
theme theory therapy threat ticket tight title topic touch tourist toward traffic transfer
transform transport travel treat treatment trend trial trust typical unable upgrade upper
urban urgent usage useful valid variable vehicle venue verify versus via victim video
violence virtual visible visitor vital volume voucher wage warning wealth website weekend
welcome whatever wherever widely willing withdraw worker worry worth writer yesterday
"""


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
            ctx: (sorted(nxt), list(itertools.accumulate(nxt[c] for c in sorted(nxt))))
            for ctx, nxt in counts.items()
        }

    def word(self, rng: random.Random) -> str:
        out = "^^"
        while len(out) < 16:
            chars, cum_weights = self._table[out[-2:]]
            ch = rng.choices(chars, cum_weights=cum_weights)[0]
            if ch == "$":
                break
            out += ch
        return out[2:] or "a"


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return str(rng.randint(0, 100))
    if kind < 0.6:
        return str(rng.randint(1900, 2030))
    if kind < 0.8:
        return f"{rng.randint(0, 999)}.{rng.randint(0, 99)}"
    return f"{rng.randint(0, 100)}%"


def _acronym(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVW") for _ in range(rng.randint(2, 4)))


class _Writer:
    """One seeded stream of sentences, paragraphs and JSON fragments."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = _WORDS.split()
        self.cum_weights = list(
            itertools.accumulate(1.0 / (rank + 10) for rank in range(len(self.words)))
        )
        self.shapes = _WordShapes(self.words)

    def word(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            word = self.shapes.word(rng)
        elif roll < 0.13:
            return _number(rng)
        elif roll < 0.15:
            return _acronym(rng)
        else:
            word = rng.choices(self.words, cum_weights=self.cum_weights)[0]
        roll = rng.random()
        if roll < 0.2:
            word += rng.choice(_SUFFIXES)
        elif roll < 0.22:
            word += "-" + rng.choices(self.words, cum_weights=self.cum_weights)[0]
        if rng.random() < 0.04:
            word = word.capitalize()
        return word

    def sentence(self) -> str:
        rng = self.rng
        out = [self.word() for _ in range(rng.randint(4, 22))]
        for i in range(len(out) - 1):
            if rng.random() < 0.06:
                out[i] += ","
        if rng.random() < 0.08:
            i = rng.randrange(len(out))
            left, right = rng.choice(_BRACKETS)
            out[i] = left + out[i] + right
        out[0] = out[0][:1].upper() + out[0][1:]
        return " ".join(out) + rng.choice(_PUNCT)

    def paragraph(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.06:
            return self.json_fragment()
        text = " ".join(self.sentence() for _ in range(rng.randint(1, 6)))
        if roll < 0.16:
            return rng.choice(_LINE_STARTS) + text
        return text

    def json_fragment(self) -> str:
        rng = self.rng
        props = {
            "_".join(self.word().lower() for _ in range(rng.randint(1, 2))): {
                "type": rng.choice(("string", "integer", "number", "boolean", "array")),
                "description": self.sentence(),
            }
            for _ in range(rng.randint(1, 3))
        }
        doc = {"name": self.word().lower(), "parameters": {"type": "object", "properties": props}}
        return json.dumps(doc, indent=rng.choice((None, 2)))


_PUNCT = (".", ".", ".", ".", "?", "!", ":")
_SUFFIXES = ("s", "s", "s", "ed", "ing", "ly", "er", "es", "al", "tion", "ment", "ness")
_BRACKETS = (("(", ")"), ('"', '"'), ("'", "'"), ("`", "`"), ("[", "]"))
_LINE_STARTS = ("- ", "* ", "1. ", "2. ", "## ", "# ", "    ", "> ")
_PARAGRAPH_ENDS = ("\n", "\n\n", "\n\n", " ")


def corpus(seed: int = CORPUS_SEED, paragraphs: int = CORPUS_PARAGRAPHS) -> Iterator[str]:
    """Yield the deterministic training corpus (same bytes on every machine)."""
    writer = _Writer(seed)
    for _ in range(paragraphs):
        yield writer.paragraph() + writer.rng.choice(_PARAGRAPH_ENDS)
