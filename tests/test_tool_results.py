"""Documents in a tool's result (prism_proxy.prompts.tool_results): found in the layouts
a search tool writes, served most popular first the first time, in that same order
every later time; through the proxy, the documents of two agents' retrievals share the
engine's cache, and an agent's later calls cache its whole history."""

from __future__ import annotations

import ast
import itertools
import json
import pprint
import random

import openai
import pytest
from proxy_support import ProxyFactory, proxy_factory_fixture, sim_server

from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.extraction import ALL_LAYOUTS
from prism_proxy.prompts.tool_results import (
    ToolResults,
    arrange_tool_messages,
    found_documents,
    result_documents,
)

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

DOCS = [
    "The Pont Neuf is the oldest standing bridge across the river Seine in Paris, finished "
    "in 1607 under King Henri IV.",
    "The Millau Viaduct carries the A75 motorway across the valley of the Tarn; one of its "
    "masts reaches 343 metres.",
    "The Tower Bridge in London opens its two bascules about eight hundred times a year.",
    "The Golden Gate Bridge spans the strait between San Francisco Bay and the Pacific.",
]


def results(docs: list[str]) -> list[dict]:
    return [{"title": f"doc {DOCS.index(d)}", "page_content": d, "score": 0.5} for d in docs]


def as_json(docs: list[str], indent: int | None = None) -> str:
    return json.dumps(results(docs), indent=indent)


LAYOUTS = {
    "xml": lambda docs: (
        "<documents>\n" + "\n".join(f"<document>{d}</document>" for d in docs) + "\n</documents>"
    ),
    "numbered": lambda docs: "\n".join(f"[{n}] {d}" for n, d in enumerate(docs, 1)),
    "json": as_json,
    "json-indented": lambda docs: as_json(docs, indent=2),
    # a search API's answer: the results are one member of an object
    "json-member": lambda docs: json.dumps({"query": "bridges", "results": results(docs)}),
    # what an agent SDK sends for a tool that returns a list or a dict: str(value)
    "python-list": lambda docs: str(results(docs)),
    "python-dict": lambda docs: str({"query": "bridges", "results": results(docs), "n": None}),
    # pretty-printed over lines (long strings split in pieces), accents, CRLF line ends
    "python-pformat": lambda docs: pprint.pformat(
        [{**r, "title": r["title"] + " é"} for r in results(docs)], width=50
    ).replace("\n", "\r\n"),
    "markdown": lambda docs: "".join(f"## {d.split()[1]}\n{d}\n\n" for d in docs),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_served_in_the_clients_order_a_tool_message_is_unchanged(layout: str) -> None:
    text = LAYOUTS[layout](DOCS)
    documents = result_documents(text)
    if documents is None:
        documents, _ = found_documents(text, ALL_LAYOUTS, BlockEvidence(1 << 20))
    assert documents is not None and len(documents.items) == len(DOCS)
    assert documents.compose(range(len(DOCS))) == text


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_orders_of_one_set_are_served_alike(layout: str) -> None:
    """The first sighting of a tool message orders its documents by popularity, then
    a global order: two agents that retrieved the same set are served the same text."""
    results, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)
    first = results.serve(b"a", LAYOUTS[layout](DOCS), ALL_LAYOUTS, evidence)
    second = results.serve(b"b", LAYOUTS[layout](DOCS[::-1]), ALL_LAYOUTS, evidence)
    assert first == second
    if layout == "python-pformat":  # its strings are split over lines: read them
        served = [item["page_content"] for item in ast.literal_eval(first)]
        assert sorted(served) == sorted(DOCS)
    else:
        for doc in DOCS:  # the text of every document is there, once
            assert first.count(doc) == 1


def test_popular_documents_come_first() -> None:
    results, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)
    layout = LAYOUTS["xml"]
    for _ in range(3):
        results.serve(b"x", layout([DOCS[3], DOCS[1]]) + f"{_}", ALL_LAYOUTS, evidence)
    served = results.serve(b"y", layout(DOCS), ALL_LAYOUTS, evidence)
    positions = sorted(DOCS, key=served.index)
    assert set(positions[:2]) == {DOCS[1], DOCS[3]}, served


def test_a_tool_message_is_served_the_same_every_later_time() -> None:
    """However popular its documents become meanwhile, a client's tool message is
    served as it was the first time."""
    results, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)
    text = LAYOUTS["numbered"](DOCS)
    first = results.serve(b"agent", text, ALL_LAYOUTS, evidence)
    rng = random.Random(3)
    for i in range(20):
        others = rng.sample(DOCS, 2)
        results.serve(b"other", LAYOUTS["numbered"](others) + f" {i}", ALL_LAYOUTS, evidence)
        assert results.serve(b"agent", text, ALL_LAYOUTS, evidence) == first
    assert results.stats()["repeated"] == 20


def test_blank_line_blocks_move_only_as_units() -> None:
    """A tool result of blank-line blocks: its first sighting is one unit (served as
    written); a later result whose blocks the client's evidence cut apart is served in
    units, never splitting the blocks that always travelled together."""
    results, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)
    scoped = evidence.scoped("agent")
    a = "Title: Pont Neuf\n\nThe Pont Neuf is old, finished in 1607."
    b = "The Millau Viaduct is tall."
    c = "The Tower Bridge opens often."
    first = "\n\n".join([a, b, c])
    assert results.serve(scoped.scope, first, ALL_LAYOUTS, scoped) == first
    later = "\n\n".join([c, a, b])
    served = results.serve(scoped.scope, later, ALL_LAYOUTS, scoped)
    assert a in served and sorted(served.split("\n\n")) == sorted(later.split("\n\n"))


@pytest.mark.parametrize(
    "text",
    [
        "no documents here",
        "[1] only one",
        json.dumps([{"title": "no text field"}, {"title": "x"}]),
        json.dumps([{"text": "one"}]),
        json.dumps({"text": "an object"}),
        '[{"text": "a"}, {"text": "b"}] trailing',
        '[{"text": "a"}, {"text": "b"}',
        "[" * 100_000 + "]" * 100_000,  # nested past the parser's depth
        '[{"text": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + '}, {"text": "b"}]',
    ],
    ids=range(9),
)
def test_no_documents_no_change(text: str) -> None:
    results, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)
    assert results.serve(b"c", text, ALL_LAYOUTS, evidence) == text


def test_the_records_are_bounded_in_bytes() -> None:
    capacity = 50_000
    results, evidence = ToolResults(capacity), BlockEvidence(1 << 20)
    for i in range(2_000):
        docs = [f"document {i} {j}: some text." for j in range(3)]
        results.serve(b"c", LAYOUTS["xml"](docs), ALL_LAYOUTS, evidence)
    stats = results.stats()
    assert 0 < stats["bytes"] <= stats["capacity_bytes"] <= capacity
    assert stats["arranged"] == 2_000


def test_arrange_tool_messages_touches_only_tool_messages() -> None:
    results, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)
    text = LAYOUTS["xml"](DOCS[::-1])
    messages = [
        {"role": "system", "content": text},
        {"role": "user", "content": text},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "tool_call_id": "1", "content": text},
    ]
    arrange_tool_messages(
        messages, layouts=ALL_LAYOUTS, evidence=evidence.scoped("c"), results=results
    )
    assert [m["content"] for m in messages[:2]] == [text, text]
    assert messages[3]["content"] != text and sorted(messages[3]["content"]) == sorted(text)


# --- through the proxy -----------------------------------------------------------------

SYSTEM = "You answer questions about bridges. Search with the tool first."
CALL = {
    "id": "call_search",
    "type": "function",
    "function": {"name": "search", "arguments": "{}"},
}


def agent_messages(docs: list[str], question: str, layout: str, system: str = SYSTEM) -> list[dict]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL["id"], "content": LAYOUTS[layout](docs)},
    ]


@pytest.mark.parametrize("layout", ["xml", "numbered", "json", "json-member", "python-list"])
async def test_agents_share_the_documents_their_tools_found(
    proxy_factory: ProxyFactory, layout: str
) -> None:
    """Two agent sessions whose search returned the same documents in other orders:
    the second's prompt is cached through its documents; then the first session's next
    call (its answer and a new question after the tool result) caches its whole history."""
    proxy = await proxy_factory()
    question = "Which bridge is the oldest?"
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:

        async def ask(messages: list[dict]) -> tuple[int, int]:
            answer = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=2
            )
            assert answer.usage is not None
            return answer.usage.prompt_tokens, answer.usage.prompt_tokens_details.cached_tokens

        first = agent_messages(DOCS, question, layout, f"{SYSTEM} ({layout})")
        prompt, _ = await ask(first)
        other = agent_messages(
            [DOCS[i] for i in (2, 0, 3, 1)], question, layout, f"{SYSTEM} ({layout})"
        )
        other_prompt, other_cached = await ask(other)
        # all but the end of the tool message and the generation prompt
        assert other_cached >= 0.8 * other_prompt, (other_prompt, other_cached)
        later = [
            *first,
            {"role": "assistant", "content": "The Pont Neuf."},
            {"role": "user", "content": "And the tallest?"},
        ]
        later_prompt, later_cached = await ask(later)
        assert later_cached >= prompt - 4, (prompt, later_prompt, later_cached)


@pytest.mark.parametrize(
    "layout", ["json-indented", "json-member", "python-list", "python-dict", "python-pformat"]
)
def test_every_permutation_composes_to_the_same_documents(layout: str) -> None:
    text = LAYOUTS[layout](DOCS)
    documents = result_documents(text)
    assert documents is not None
    read = json.loads if layout.startswith("json") else ast.literal_eval
    for order in itertools.permutations(range(len(DOCS))):
        served = read(documents.compose(order))
        items = served if isinstance(served, list) else served["results"]
        assert [item["page_content"] for item in items] == [DOCS[i] for i in order]
        if isinstance(served, dict):  # the other members stay as they were
            assert {k: v for k, v in served.items() if k != "results"} == {
                k: v for k, v in read(text).items() if k != "results"
            }


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"a": results(DOCS), "b": results(DOCS)}),  # two lists: which one?
        str({"a": results(DOCS), "b": results(DOCS)}),
        json.dumps({"results": results(DOCS)}) + " and more",
        str(results(DOCS)) + " and more",
        "[{'text': 'a\\q'}, {'text': 'b'}]",  # an escape Python does not write
        "[{'text': 'a'}, {'text': 'b'}] if __import__('os') else []",  # not a literal
        "[{'text': 'a'}, {'text': 1}]",  # one element without text
        str([{"text": "a"}]),  # one result
        "[" * 5000 + "]" * 5000,  # nested past the parser's depth
        "{'results': [{'text': 'a'}, {'text': 'b'}], " * 3000,  # cut short
    ],
    ids=lambda text: text[:24],
)
def test_no_results_are_guessed_from_other_structures(text: str) -> None:
    assert result_documents(text) is None


def test_text_parts_of_a_tool_message_are_its_documents() -> None:
    """A tool that returned several texts (one content part each): the parts are the
    documents, served in one order for two orders of the same set, then the same every
    later time; a message with a non-text part is left alone."""
    results_, evidence = ToolResults(1 << 20), BlockEvidence(1 << 20)

    def tool_message(docs: list[str]) -> dict:
        parts = [{"type": "text", "text": d} for d in docs]
        return {"role": "tool", "tool_call_id": "1", "content": parts}

    served = []
    for client, docs in (("a", DOCS), ("b", DOCS[::-1]), ("a", DOCS)):
        messages = [tool_message(docs)]
        arrange_tool_messages(
            messages, layouts=ALL_LAYOUTS, evidence=evidence.scoped(client), results=results_
        )
        served.append([part["text"] for part in messages[0]["content"]])
    assert served[0] == served[1] == served[2] and sorted(served[0]) == sorted(DOCS)
    assert results_.stats()["repeated"] == 1
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    mixed = tool_message(DOCS[::-1])
    mixed["content"].append(image)
    before = json.loads(json.dumps(mixed))
    arrange_tool_messages(
        [mixed], layouts=ALL_LAYOUTS, evidence=evidence.scoped("c"), results=results_
    )
    assert mixed == before


@pytest.mark.parametrize(
    "overrides", [{"policy": "fifo"}, {"extraction_reorder": False}], ids=["fifo", "no-reorder"]
)
async def test_a_tool_result_keeps_the_clients_order_where_nothing_reorders(
    proxy_factory: ProxyFactory, overrides: dict
) -> None:
    """Under a policy that keeps the client's order (the `fifo` line), or with
    reordering off, a tool result is served as the client wrote it: a second agent
    whose search found the same documents in another order shares only what precedes
    them."""
    proxy = await proxy_factory(**overrides)
    question = "Which bridge is the oldest?"
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        # a system prompt of its own: the engine is shared by this module's tests
        system = f"{SYSTEM} ({sorted(overrides.items())})"
        for docs in (DOCS, [DOCS[i] for i in (2, 0, 3, 1)]):
            answer = await client.chat.completions.create(
                model="m", messages=agent_messages(docs, question, "xml", system), max_tokens=2
            )
    assert answer.usage is not None
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert cached < 0.5 * answer.usage.prompt_tokens, (cached, answer.usage.prompt_tokens)


def test_no_large_tree_is_built_for_text_that_cannot_be_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More dicts than results may hold, or a list of a hundred thousand numbers: the
    text is refused before the parser builds its tree."""
    import prism_proxy.prompts.tool_results as tool_results

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed")

    monkeypatch.setattr(tool_results.ast, "parse", no_parse)
    for text in (
        str([{"text": "a"}] * 60_000),
        str([{"text": "a", "vector": [0.5] * 100_000}, {"text": "b"}]),
    ):
        assert tool_results.literal_documents(text) is None
    monkeypatch.undo()
    assert tool_results.literal_documents(str([{"text": "a"}] * 200)) is not None
