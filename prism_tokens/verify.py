"""Is a tokenizer the engine's? Probe texts and chats, tokenized on both sides, compared.

The proxy sends token ids only if its tokenizer gives the ids the engine's would
(docs/proxy.md, "The tokenizer"). It cannot compare files (the engine may be elsewhere),
so it compares behaviour: the engine tokenizes the probes (SGLang's `/v1/tokenize`), the
proxy tokenizes them too, and `compare` says whether every result agrees.

The probes are chosen to separate vocabularies: several scripts (a byte-level BPE trained
on other text splits them otherwise), digits and numbers (tokenizers split digits one by
one, in threes or not at all), runs of whitespace, tabs and newlines (merged or not),
punctuation and code, and emoji (byte fallback). The chat probes (one user message; a
system prompt and three turns) go through each side's chat template as a chat completion
renders it, so a tokenizer with the engine's vocabulary and another template is caught.

Pure: no I/O here. `tokenize_probes` runs the proxy's tokenizer; the engine's answers
arrive as a `Tokenization` built by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prism_tokens.chat import content_format, template_messages
from prism_tokens.tokenizer import ChatTemplateError, Tokenizer

# (name, text): tokenized without special tokens on both sides.
PROBE_TEXTS: tuple[tuple[str, str], ...] = (
    ("english", "The quick brown fox jumps over the lazy dog, doesn't it?"),
    ("latin", "Ünïcödé: café, naïve, Straße, smørrebrød, Łódź, São Paulo, Ærøskøbing"),
    ("cyrillic-greek", "Съешь же ещё этих мягких французских булок. Γειά σου, κόσμε!"),
    ("cjk", "我能吞下玻璃而不伤身体。日本語のテキストです。한국어 문장입니다."),
    ("rtl-indic", "مرحبا بالعالم — שלום עולם — नमस्ते दुनिया — வணக்கம்"),
    ("digits", "0 7 42 1234567890 3.14159 -2.5e-3 2024-06-01T12:34:56Z 1,000,000 0x1F"),
    ("whitespace", "  two\tone tab\t\ttwo tabs\n\nblank line\r\ncrlf   three   \n\n\n  end "),
    ("code", "def f(x):\n    return {\"a\": [1, 2, 3], 'b': x ** 2}  # note\n"),
    ("punctuation", "!!! ??? ... --- *** ((())) [[]] {{}} <<>> @#$%^&*_+=|\\/~`'\";:"),
    ("emoji-symbols", "ok 👍🏽 🎉🇫🇷 ∑∫√∞ ≠ ≤ ≥ → ½ ™ ©"),
    ("identifiers", "HTTPServerError camelCaseIdentifier snake_case_name SCREAMING-KEBAB"),
)

# (name, messages): rendered as a chat completion renders them (generation prompt on).
PROBE_CHATS: tuple[tuple[str, tuple[dict[str, str], ...]], ...] = (
    ("chat-user", ({"role": "user", "content": "Hello! What is 2 + 2?"},)),
    (
        "chat-turns",
        (
            {"role": "system", "content": "You are a careful assistant. Answer briefly."},
            {"role": "user", "content": "Name a river in Spain.\nOne word, please."},
            {"role": "assistant", "content": "Ebro."},
            {"role": "user", "content": "¿Y en Francia? Answer with 1 word."},
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class ChatResult:
    """A chat probe's ids, or why that side could not render it (`error`)."""

    ids: tuple[int, ...] | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Tokenization:
    """One side's results: the ids of each of `PROBE_TEXTS` and each of `PROBE_CHATS`,
    in their order."""

    texts: tuple[tuple[int, ...], ...]
    chats: tuple[ChatResult, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether two tokenizations agree; when not, `difference` says where first."""

    matches: bool
    difference: str = ""


def tokenize_probes(tokenizer: Tokenizer) -> Tokenization:
    """The proxy's side: the texts as it encodes prompt text, the chats as its token
    path renders and encodes a chat (SGLang's message dump, the generation prompt)."""
    texts = tuple(tuple(tokenizer.encode(text)) for _, text in PROBE_TEXTS)
    fmt = content_format(tokenizer.chat_template)
    chats = []
    for _, messages in PROBE_CHATS:
        try:
            text = tokenizer.render_chat(template_messages(messages, fmt))
        except ChatTemplateError as exc:
            chats.append(ChatResult(error=str(exc)))
            continue
        chats.append(ChatResult(ids=tuple(tokenizer.encode_chat(text))))
    return Tokenization(texts, tuple(chats))


def _first_difference(ours: Sequence[int], theirs: Sequence[int]) -> str:
    index = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    return (
        f"{len(ours)} tokens here, {len(theirs)} in the engine; from token {index}: "
        f"{list(ours[index : index + 6])} here, {list(theirs[index : index + 6])} in the engine"
    )


def compare(ours: Tokenization, theirs: Tokenization) -> Verdict:
    """Every text probe must give the same ids. A chat probe must too where both sides
    render it; where only the engine renders it, the proxy sends such chats to the
    engine's own endpoint (no chat template, or one that refuses them), which is safe;
    where only the proxy renders it, the templates differ."""
    if len(ours.texts) != len(theirs.texts) or len(ours.chats) != len(theirs.chats):
        return Verdict(False, "the engine answered another number of probes")
    for (name, _), mine, engine in zip(PROBE_TEXTS, ours.texts, theirs.texts, strict=True):
        if mine != engine:
            return Verdict(False, f"text probe {name!r}: {_first_difference(mine, engine)}")
    for (name, _), mine, engine in zip(PROBE_CHATS, ours.chats, theirs.chats, strict=True):
        if mine.ids is None:
            continue
        if engine.ids is None:
            return Verdict(
                False, f"chat probe {name!r}: the engine cannot render it ({engine.error})"
            )
        if mine.ids != engine.ids:
            return Verdict(False, f"chat probe {name!r}: {_first_difference(mine.ids, engine.ids)}")
    return Verdict(True)
