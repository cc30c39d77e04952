"""Documents found inside one message's text (prism_proxy.prompts.extraction): the
layouts of common RAG code, the exact-text invariant, and bad input."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_proxy.prompts.document_spans import Extraction
from prism_proxy.prompts.extraction import ALL_LAYOUTS, extract

CERTAIN_LAYOUTS = {"xml", "numbered", "markdown"}


def rebuilt(found: Extraction) -> str:
    if found.layout == "numbered":
        assert found.labels is not None
        body = "".join(
            label + doc for label, doc in zip(found.labels, found.documents, strict=True)
        )
    else:
        body = "".join(found.documents)
    return found.preamble + body + found.suffix


def check(text: str, found: Extraction | None, min_documents: int = 2, max_documents: int = 256):
    """The contract every extraction keeps, whatever the text."""
    if found is None:
        return
    assert rebuilt(found) == text
    assert found.layout in ALL_LAYOUTS
    assert min_documents <= len(found.documents) <= max_documents
    assert all(doc.strip() for doc in found.documents)
    if found.layout == "numbered":
        assert found.labels is not None and found.label_format is not None
        assert [found.label_format.format(n=i) for i in range(1, len(found.labels) + 1)] == list(
            found.labels
        )
    else:
        assert found.labels is None and found.label_format is None
    if found.layout in CERTAIN_LAYOUTS:
        # but one element wrapping blank-line blocks (which the evidence must judge)
        wrapped = re.search(r"<[A-Za-z][^<>]*>\n?$", found.preamble) and found.suffix[:2] == "</"
        assert found.certain or (found.layout == "xml" and wrapped)
    if found.layout == "blank":
        assert not found.certain


# --- the frameworks' defaults ---------------------------------------------------------

LANGCHAIN_STUFF = (  # langchain's stuff_prompt: documents joined with "\n\n"
    "Use the following pieces of context to answer the question at the end.\n\n"
    "Paris is the capital of France.\n\n"
    "Berlin is the capital of Germany.\nIt is large.\n\n"
    "Question: What is the capital of France?\nHelpful Answer:"
)
LLAMA_INDEX_QA = (  # llama_index DEFAULT_TEXT_QA_PROMPT_TMPL, nodes joined with "\n\n"
    "Context information is below.\n---------------------\n"
    "node one\n\nnode two\n\nnode three\n"
    "---------------------\n"
    "Given the context information and not prior knowledge, answer the query.\n"
    "Query: why?\nAnswer: "
)
HAYSTACK_LOOP = (  # {% for document in documents %}\n    {{ document.content }}\n{% endfor %}
    "Given the following information, answer the question.\n\nContext:\n\n"
    "    first doc\n\n    second doc\n\n\nQuestion: who?\nAnswer:"
)
ANTHROPIC_XML = (
    "<documents>\n"
    '<document index="1">\n<source>a.txt</source>\n'
    "<document_content>alpha</document_content>\n</document>\n"
    '<document index="2">\n<source>b.txt</source>\n'
    "<document_content>beta</document_content>\n</document>\n"
    "</documents>\n\nWhich file mentions beta?"
)

CASES = [
    (
        "langchain stuff: instruction block, two documents, question",
        LANGCHAIN_STUFF,
        "blank",
        "",
        (
            "Use the following pieces of context to answer the question at the end.\n\n",
            "Paris is the capital of France.\n\n",
            "Berlin is the capital of Germany.\nIt is large.\n\n",
        ),
        "Question: What is the capital of France?\nHelpful Answer:",
        None,
    ),
    (
        "llama_index text QA: blank-line blocks between the rules, the last up to the rule",
        LLAMA_INDEX_QA,
        "dashed",
        "Context information is below.\n---------------------\n",
        ("node one\n\n", "node two\n\n", "node three\n"),
        LLAMA_INDEX_QA[LLAMA_INDEX_QA.rindex("-----------") - 10 :],
        None,
    ),
    (
        "haystack loop: indentation stays with its block; a run of blank lines is one separator",
        HAYSTACK_LOOP,
        "blank",
        "",
        (
            "Given the following information, answer the question.\n\n",
            "Context:\n\n",
            "    first doc\n\n",
            "    second doc\n\n\n",
        ),
        "Question: who?\nAnswer:",
        None,
    ),
    (
        "anthropic xml: the wrapper to preamble and suffix, nested <source> stays inside",
        ANTHROPIC_XML,
        "xml",
        "<documents>\n",
        (
            '<document index="1">\n<source>a.txt</source>\n'
            "<document_content>alpha</document_content>\n</document>\n",
            '<document index="2">\n<source>b.txt</source>\n'
            "<document_content>beta</document_content>\n</document>\n",
        ),
        "</documents>\n\nWhich file mentions beta?",
        None,
    ),
    (
        "xml on one line, no separators; the last takes the whitespace lines after it",
        "Docs: <doc>a</doc><doc>b</doc>\n\nQ?",
        "xml",
        "Docs: ",
        ("<doc>a</doc>", "<doc>b</doc>\n\n"),
        "Q?",
        None,
    ),
    (
        "[n] single lines: the last takes the earlier documents' separator '\\n'",
        "Sources:\n[1] alpha\n[2] beta\n[3] gamma\n\nQuestion: q?",
        "numbered",
        "Sources:\n",
        ("alpha\n", "beta\n", "gamma\n"),
        "\nQuestion: q?",
        ("[1] ", "[2] ", "[3] "),
    ),
    (
        "Document n: joined by blank lines: the last takes '\\n\\n'",
        "Document 1: alpha\nmore\n\nDocument 2: beta\n\nQuestion: q?",
        "numbered",
        "",
        ("alpha\nmore\n\n", "beta\n\n"),
        "Question: q?",
        ("Document 1: ", "Document 2: "),
    ),
    (
        "numbered list of instructions loses to [n] (style priority)",
        "Rules:\n1. Be brief\n2. Cite\n\n[1] a\n[2] b\n\nQ",
        "numbered",
        "Rules:\n1. Be brief\n2. Cite\n\n",
        ("a\n", "b\n"),
        "\nQ",
        ("[1] ", "[2] "),
    ),
    (
        "[n] quoted mid-line inside a document is text",
        "[1] see [2] and\n[3] is not at a line start? it is: no, [2] starts here\n",
        None,
        None,
        None,
        None,
        None,
    ),
    (
        "no blank line after the last, single-line documents: the last is its own line",
        "(1) a\n(2) b\nWhich?",
        "numbered",
        "",
        ("a\n", "b\n"),
        "Which?",
        ("(1) ", "(2) "),
    ),
    (
        "multi-paragraph numbered documents: the final paragraph is the suffix",
        "[1] a\n\na2\n\n[2] b\n\nb2\n\nQuestion?",
        "numbered",
        "",
        ("a\n\na2\n\n", "b\n\nb2\n\n"),
        "Question?",
        ("[1] ", "[2] "),
    ),
    (
        "markdown: a title before, a shallower header after ends the last document",
        "# Context\n## A\ntext a\n\nmore a\n\n## B\ntext b\n\n# Question\nq",
        "markdown",
        "# Context\n",
        ("## A\ntext a\n\nmore a\n\n", "## B\ntext b\n\n"),
        "# Question\nq",
        None,
    ),
    (
        "markdown: single-paragraph sections, the last ends at its first blank line",
        "### A\ntext a\n\n### B\ntext b\n\nQuestion: q",
        "markdown",
        "",
        ("### A\ntext a\n\n", "### B\ntext b\n\n"),
        "Question: q",
        None,
    ),
    (
        "markdown: sub-sections inside documents; the level with more headers wins",
        "## D1\n### S\nx\n### T\ny\n## D2\nz\n## D3\nw\n\nQ",
        "markdown",
        "",
        ("## D1\n### S\nx\n### T\ny\n", "## D2\nz\n", "## D3\nw\n"),
        "\nQ",
        None,
    ),
    (
        "one <context> wrapping documents joined by blank lines (LangChain's retrieval QA)",
        "Answer from the context below:\n\n<context>\na\n\nb\n\nc\n</context>",
        "xml",
        "Answer from the context below:\n\n<context>\n",
        ("a\n\n", "b\n\n", "c\n"),
        "</context>",
        None,
    ),
    (
        "one wrapping element around numbered documents: numbered wins inside",
        "<context>\n[1] a\n[2] b\n</context>\nQ",
        "numbered",
        "<context>\n",
        ("a\n", "b\n"),
        "</context>\nQ",
        ("[1] ", "[2] "),
    ),
    (
        "dashed around numbered documents: numbered wins inside, labels kept",
        "Context:\n---\n[1] a\n[2] b\n---\nQ",
        "numbered",
        "Context:\n---\n",
        ("a\n", "b\n"),
        "---\nQ",
        ("[1] ", "[2] "),
    ),
]


@pytest.mark.parametrize(
    ("text", "layout", "preamble", "documents", "suffix", "labels"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_layouts(text, layout, preamble, documents, suffix, labels) -> None:
    found = extract(text)
    check(text, found)
    if layout is None:
        assert found is None or found.layout != "numbered"
        return
    assert found is not None
    assert (found.layout, found.preamble, found.documents, found.suffix, found.labels) == (
        layout,
        preamble,
        documents,
        suffix,
        labels,
    )


def test_a_document_renumbered_keeps_its_text() -> None:
    first = extract("[1] alpha\n[2] beta\n[3] gamma\n\nQ")
    second = extract("[1] gamma\n[2] alpha\n[3] beta\n\nQ")
    assert first is not None and second is not None
    assert sorted(first.documents) == sorted(second.documents)
    assert first.label_format == second.label_format == "[{n}] "


@pytest.mark.parametrize(
    ("text", "layouts"),
    [
        ("[1] a\n[3] b\n\nQ", ["numbered"]),  # skipped
        ("[1] a\n[1] b\n\nQ", ["numbered"]),  # repeated
        ("[2] a\n[3] b\n\nQ", ["numbered"]),  # not from 1
        ("[1] a\n[2]: b\n\nQ", ["numbered"]),  # two label formats
        ("Doc 1: a\nDocument 2: b\n\nQ", ["numbered"]),  # two words
        ("<doc>a</doc>\n<doc>b\n\nQ", ["xml"]),  # unbalanced
        ("<doc>a<doc>x</doc></doc>\n<doc>b</doc>", ["xml"]),  # nested same-name
        ("<doc>a<source></doc>\n<doc></source>b</doc>", ["xml"]),  # overlapping
        ("<doc>a</doc>\ntext\n<doc>b</doc>", ["xml"]),  # not siblings
        ("<context>\none block only\n</context>\nQ", ["xml"]),  # one wrapped document
        ("## A\na\n# Part\n## B\nb", ["markdown"]),  # a shallower header between
        ("```\n## A\n## B\n```\n", ["markdown"]),  # headers in fenced code
        ("---\none block only\n---\nQ", ["dashed"]),  # a single document < min_documents
        ("---\na\n\nb\n", ["dashed"]),  # never closed
        ("one paragraph\n\nthe question", ["blank"]),  # a single document
        ("", ALL_LAYOUTS),
        ("\n\n\n", ALL_LAYOUTS),
    ],
)
def test_not_this_layout(text: str, layouts: list[str]) -> None:
    assert extract(text, layouts) is None


def test_nested_other_tags_and_html_void_elements_stay_inside() -> None:
    text = '<doc>a <source src="x.mp4"> b</doc>\n<doc>c <article>d</article></doc>\n\nQ'
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "xml"
    assert found.documents == (
        '<doc>a <source src="x.mp4"> b</doc>\n',
        "<doc>c <article>d</article></doc>\n",  # the earlier separator; "\nQ" the suffix
    )


def test_an_inline_mention_of_the_tag_falls_back_to_blank_lines() -> None:
    text = "<doc>write <doc> to open</doc>\n\n<doc>b</doc>\n\nQ"
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "blank"


def test_single_dashed_document_when_allowed() -> None:
    text = "Context:\n-----\none block\nstill one\n-----\nQ"
    found = extract(text, min_documents=1)
    assert found is not None
    assert (found.layout, found.documents, found.certain) == (
        "dashed",
        ("one block\nstill one\n",),
        True,
    )


def test_layout_selection_and_bounds() -> None:
    text = "[1] a\n[2] b\n\nQ"
    assert extract(text, ["blank"]) is None  # one block before the suffix
    assert extract(text, ["numbered"], min_documents=3) is None
    assert extract(text, ["numbered"], min_documents=1, max_documents=1) is None
    with pytest.raises(ValueError, match="unknown layouts"):
        extract(text, ["yaml"])
    with pytest.raises(ValueError):
        extract(text, min_documents=0)


# --- the invariant on arbitrary text ------------------------------------------------------

PIECES = [
    "\n", "\n\n", "\n \n", "\r\n", " ", "alpha", "beta", "é🙂",
    "[1] ", "[2] ", "[3] ", "[2]: ", "[1]: ", "Document 1: ", "Doc 2: ", "SOURCE 3: ",
    "1. ", "2. ", "(1) ", "(2) ", "<doc>", "</doc>", '<document index="1">', "</document>",
    "<source>", "</source>", "<doc/>", "<documents>", "## ", "### ", "# ", "```", "---",
    "===", "***", "\n-----\n", "Question: ",
]  # fmt: skip
SOUP = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=50).map("".join)


@settings(max_examples=1500, deadline=None)
@given(
    text=SOUP,
    layouts=st.sets(st.sampled_from(ALL_LAYOUTS), min_size=1),
    min_documents=st.integers(1, 3),
    extra=st.integers(0, 4),
)
def test_any_text_keeps_the_invariant(text, layouts, min_documents, extra) -> None:
    max_documents = min_documents + extra
    found = extract(text, layouts, min_documents=min_documents, max_documents=max_documents)
    check(text, found, min_documents, max_documents)
    if found is not None:
        assert found.layout in layouts or (found.layout in CERTAIN_LAYOUTS and "dashed" in layouts)


WORD = st.sampled_from(["alpha", "beta", "gamma", "delta", "river", "mill", "é🙂", "x,y"])
LINE = st.lists(WORD, min_size=1, max_size=5).map(" ".join)
PARAGRAPH = st.lists(LINE, min_size=1, max_size=3).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(LINE, min_size=2, max_size=8),
    label=st.sampled_from(
        [
            "[{n}] ",
            "[{n}]: ",
            "Document {n}: ",
            "Source {n}: ",
            "({n}) ",
            "{n}. ",
            "{n}) ",
            "Document [{n}]: ",
            "Context {n}: ",
            "Passage {n} - ",
            "**Source {n}:** ",
            "Chunk #{n}: ",
            "Search result {n}: ",
            "doc {n}. ",
            "<{n}> ",
            "[Document {n}] ",
            "(Source {n}) ",
            "**Document {n}**: ",
            "*Passage {n}*: ",
            "    Document {n}: ",  # indented by a template's loop
            "\t[{n}] ",
        ]
    ),
    joiner=st.sampled_from(["\n", "\n\n"]),
    preamble=st.sampled_from(["", "Answer from these sources:\n", "Sources:\n\n"]),
)
def test_numbered_documents_are_found_exactly(docs, label, joiner, preamble) -> None:
    body = "".join(label.format(n=i) + doc + joiner for i, doc in enumerate(docs, 1))
    text = preamble + body + "\nQuestion: which?"
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "numbered"
    assert found.documents == tuple(doc + joiner for doc in docs)
    assert found.label_format == label
    assert found.suffix == "\nQuestion: which?"


@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(PARAGRAPH, min_size=2, max_size=8),
    tag=st.sampled_from(["document", "doc", "passage", "search_result", "file"]),
    joiner=st.sampled_from(["", "\n", "\n\n"]),
    wrapped=st.booleans(),
)
def test_xml_documents_are_found_exactly(docs, tag, joiner, wrapped) -> None:
    elements = [f'<{tag} id="{i}">{doc}</{tag}>' for i, doc in enumerate(docs)]
    body = joiner.join(elements) + "\n"
    text = ("<documents>\n" + body + "</documents>" if wrapped else body) + "\n\nQ?"
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "xml"
    # the last takes the earlier documents' separator, else the blank lines after it
    last = "\n" if wrapped else (joiner or "\n\n\n")
    assert found.documents == (*(e + joiner for e in elements[:-1]), elements[-1] + last)


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(PARAGRAPH, min_size=2, max_size=8), instruction=st.booleans())
def test_blank_line_blocks_are_found_exactly(docs, instruction) -> None:
    blocks = (["Use these:"] if instruction else []) + docs
    text = "\n\n".join([*blocks, "Question: which?"])
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "blank" and not found.certain
    assert found.documents == tuple(block + "\n\n" for block in blocks)


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(PARAGRAPH, min_size=2, max_size=8), rule=st.sampled_from(["---", "=" * 21]))
def test_dashed_blocks_are_found_exactly(docs, rule) -> None:
    head = f"Context information is below.\n{rule}\n"
    tail = f"{rule}\nGiven the context information, answer the query.\nQuery: q\nAnswer: "
    text = head + "\n\n".join(docs) + "\n" + tail
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "dashed" and not found.certain
    assert (found.preamble, found.suffix) == (head, tail)
    assert found.documents == (*(doc + "\n\n" for doc in docs[:-1]), docs[-1] + "\n")


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(st.lists(PARAGRAPH, min_size=1, max_size=3), min_size=2, max_size=6))
def test_markdown_sections_are_found_exactly(docs) -> None:
    sections = [f"## Title {i}\n" + "\n\n".join(paragraphs) for i, paragraphs in enumerate(docs)]
    text = "# Context\n" + "\n\n".join(sections) + "\n\n# Question\nwhich?"
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "markdown"
    assert found.documents == tuple(section + "\n\n" for section in sections)


# --- bad input: linear passes, and "nothing found" rather than a guess ------------------
# No clock: each input is large enough (about 1 MB or 10^5 markers) that a finder doing
# quadratic work would not finish under the timeout, and each result is asserted.

MB = 1 << 20


BAD_INPUT = [
    ("1e5 consecutive [n] markers", "".join(f"[{i}] x\n" for i in range(1, 100_001)), None),
    ("1e5 colliding [1] markers", "[1] x\n" * 100_000, None),
    ("1e5 '1. ' lines", "1. x\n" * 100_000, None),
    ("1e5 markdown headers", "## h\nx\n" * 100_000, None),
    ("1 MB of blank lines", "\n" * MB, None),
    ("1 MB of blank-line separators with spaces", " \n" * (MB // 2), None),
    ("1e5 blank-line blocks", "x\n\n" * 100_000, None),
    ("1e5 nested <doc>", "<doc>" * 100_000 + "x" + "</doc>" * 100_000, None),
    ("1e5 unclosed <doc>", "<doc>x\n" * 100_000, None),
    ("1e5 stray </doc>", "</doc>\n" * 100_000, None),
    ("1 MB of '<'", "<" * MB, None),
    ("an unterminated attribute", "<doc " + "a" * MB, None),
    ("1e5 rule lines", "---\n" * 100_000, None),
    ("a 1 MB rule line", "-" * MB + "x\n", None),
    ("1 MB line of spaces after a newline", "\n" + " " * MB + "x", None),
    ("1e5 blank-line blocks in a dashed frame", "---\n" + "x\n\n" * 100_000 + "---\nQ", None),
    ("1e5 code fences", "```\n## h\n" * 100_000, None),
    ("1e5 interleaved nested tags", "<doc><source>" * 50_000 + "</source></doc>" * 50_000, None),
    ("1 MB of '#'", "#" * MB, None),
    ("1 MB of '['", "[" * MB, None),
    (
        "1e5 xml documents: more than max_documents",
        "<doc>x</doc>\n" * 100_000 + "\nQ",
        None,
    ),
    (
        "256 xml documents of 4 KB each",
        "".join(f"<doc>{'y' * 4096}</doc>\n" for _ in range(256)) + "\nQ",
        "xml",
    ),
    (
        "a 1 MB numbered document list with markers quoted mid-line",
        "".join(f"[{i}] cites [{i + 1}] and [1] {'z' * 4000}\n" for i in range(1, 257)) + "\nQ",
        "numbered",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "text", "expected"), BAD_INPUT, ids=[case[0] for case in BAD_INPUT]
)
def test_bad_input(name: str, text: str, expected: str | None) -> None:
    found = extract(text)
    check(text, found)
    assert (found and found.layout) == expected, name


@pytest.mark.parametrize(
    "label", ["Document {n}:", "[{n}]", "Source [{n}]", "**Context {n}**", "Retrieved passage {n}:"]
)
def test_a_label_on_its_own_line(label: str) -> None:
    docs = ["The Osse flows north.", "Two bridges cross it.", "The mill is old."]
    body = "".join(f"{label.format(n=i)}\n{doc}\n\n" for i, doc in enumerate(docs, 1))
    text = "Answer from these:\n\n" + body + "Which bridge?"
    found = extract(text)
    check(text, found)
    assert found is not None and found.layout == "numbered"
    assert found.label_format == label
    assert [d.strip() for d in found.documents] == docs


@pytest.mark.parametrize(
    "text",
    [
        "Step 1: open the file\nStep 2: read it\n\nWhat next?",  # steps keep their order
        "Question 1: a\nQuestion 2: b\n\nAnswer both.",
        "1 apple\n2 pears\n\nHow many?",  # a bare number without punctuation
        "[1) a\n[2) b\n\nQ",  # unpaired brackets
        "**Document 1: a\n**Document 2: b\n\nQ",  # unpaired emphasis
        "**Document 1**:** a\n**Document 2**:** b\n\nQ",  # emphasis closed twice
        "[Document 1) a\n[Document 2) b\n\nQ",  # unpaired brackets
        "[1 a\n[2 b\n\nQ",  # an unnamed label in outer brackets
    ],
)
def test_labels_that_do_not_name_documents_are_text(text: str) -> None:
    found = extract(text, ["numbered"])
    assert found is None
