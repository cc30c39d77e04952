"""Our users' clients, unmodified, pointed at the proxy.

Each framework comes from PyPI (the `dev` extra) and is used as its documentation shows,
with no PRISM code: only its base URL is the proxy's (a real `prism-proxy` in front of
the simulated engine on loopback). Each one's second call reuses the engine's cache:

* the RAG clients (LangChain, LlamaIndex, Haystack) send the same documents again in the
  reverse order, with another question: the proxy finds the documents in the message
  and serves them in the order the engine cached, so the second prompt is cached up to
  its question;
* the agent (OpenAI Agents SDK) calls its function tool on the first model call
  (`tool_choice="required"`, answered by the simulated engine as SGLang answers it,
  `prism_sim.tool_calls`) and answers on the second, whose prompt starts with the
  first's.

LangChain runs with two prompts: the documents then the question in the user message,
and its retrieval-QA chat prompt, which puts them in the system message.

Nothing here reaches the network: llama-index-core ships the tiktoken (cl100k_base) and
NLTK files it reads, Haystack's telemetry is off (`haystack_offline`), and so are
LangSmith's and the Agents SDK's tracing; an audit hook fails any test that resolves or
connects to an address off loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import httpx
import pytest
from agents import (
    Agent,
    FunctionToolResult,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    ToolsToFinalOutputResult,
    function_tool,
    set_tracing_disabled,
)
from haystack_offline import ChatMessage, ChatPromptBuilder, OpenAIChatGenerator, Pipeline, Secret
from haystack_offline import Document as HaystackDocument
from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_openai import ChatOpenAI
from langsmith import tracing_context
from llama_index.core import get_response_synthesizer
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.llms.openai_like import OpenAILike
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall
from proxy_support import ProxyFactory, metric_total, proxy_factory_fixture, sim_server

from prism_proxy.app import RunningProxy
from prism_proxy.edge.gateway import GATEWAY

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

DOCS = [
    "The Pont Neuf is the oldest standing bridge across the river Seine in Paris, finished "
    "in 1607 under King Henri IV after nearly thirty years of work. Its twelve arches rest "
    "on the western tip of the Ile de la Cite.",
    "The Millau Viaduct carries the A75 motorway across the valley of the Tarn in southern "
    "France; one of its masts reaches 343 metres, higher than the Eiffel Tower, and it "
    "opened to traffic in December 2004.",
    "The Tower Bridge in London opens its two bascules about eight hundred times a year to "
    "let tall ships pass on the Thames below the city; its high-level walkways were closed "
    "to the public from 1910 to 1982.",
    "The Golden Gate Bridge spans the strait between San Francisco Bay and the Pacific "
    "Ocean; its main span of 1,280 metres was the longest in the world when the bridge "
    "opened in May 1937.",
]
FIRST_QUESTION = "Which bridge is the oldest?"
SECOND_QUESTION = "Which bridge has the tallest mast?"
MAX_TOKENS = 4


# --- no network ------------------------------------------------------------------------


class OutboundWatch:
    """Name lookups and connections off loopback made while `watching`: an audit hook,
    installed once for the process (hooks cannot be removed) and idle otherwise."""

    def __init__(self) -> None:
        self.watching = False
        self.seen: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.watching or event not in ("socket.getaddrinfo", "socket.connect"):
            return
        address = args[0] if event == "socket.getaddrinfo" else args[1]
        if event == "socket.connect":
            if not isinstance(address, tuple):
                return  # a Unix socket's path
            address = address[0]
        if isinstance(address, bytes):
            address = address.decode(errors="replace")
        if isinstance(address, str) and not is_loopback(address):
            self.seen.append(f"{event} {address}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


OUTBOUND = OutboundWatch()
sys.addaudithook(OUTBOUND)


@pytest.fixture(autouse=True)
def no_network() -> Iterator[None]:
    OUTBOUND.seen.clear()
    OUTBOUND.watching = True
    try:
        yield
    finally:
        OUTBOUND.watching = False
    assert not OUTBOUND.seen, f"a framework tried to reach the network: {OUTBOUND.seen}"


# --- what the proxy saw ------------------------------------------------------------------


class Counts(NamedTuple):
    """Prompt and cached tokens, and by layout the requests in which the proxy found
    documents."""

    prompt_tokens: int
    cached_tokens: int
    found: dict[str, int]


async def proxy_counts(proxy: RunningProxy) -> Counts:
    """The proxy's totals: tokens over all lanes, requests whose documents were found
    (outcome `found` or `found-ordered`)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(proxy.url + "/metrics")).text
    prompt = int(metric_total(text, "prism:prompt_tokens_total"))
    cached = int(metric_total(text, "prism:cached_tokens_total"))
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("prism:extraction_total{"):
            labels = dict(p.split("=", 1) for p in name[name.index("{") + 1 : -1].split(","))
            if labels["outcome"].strip('"').startswith("found"):
                layout = labels["layout"].strip('"')
                found[layout] = found.get(layout, 0) + int(float(value))
    return Counts(prompt, cached, found)


# (prompt tokens, cached tokens) as the framework reports them, or None where it does not
Ask = Callable[[list[str], str], tuple[int, int] | None]


# Second calls: the same documents in another order. `rotated` keeps runs of the first
# order together (the first call's evidence glues them), `shuffled` keeps no pair.
ORDERS = {"rotated": [1, 2, 3, 0], "shuffled": [2, 0, 3, 1]}
order_param = pytest.mark.parametrize("order", list(ORDERS))


async def second_call_reuse(proxy: RunningProxy, ask: Ask, order: str) -> Counts:
    """Ask about `DOCS`, then about the same documents in another `order` (the
    framework's own blocking call, in a thread: the proxy runs on this event loop)."""
    await asyncio.to_thread(ask, DOCS, FIRST_QUESTION)
    before = await proxy_counts(proxy)
    usage = await asyncio.to_thread(ask, [DOCS[i] for i in ORDERS[order]], SECOND_QUESTION)
    after = await proxy_counts(proxy)
    if usage is None:
        usage = (
            after.prompt_tokens - before.prompt_tokens,
            after.cached_tokens - before.cached_tokens,
        )
    return Counts(*usage, found=after.found)


def assert_documents_reused(reuse: Counts, layout: str, share: float) -> None:
    assert reuse.found == {layout: 2}, reuse
    # The proxy serves the second call's documents in the order the engine cached (the
    # first call's), so its prompt is token for token the first's up to the question:
    # the chat template's head, the template's text before the documents, and the
    # documents. `share`: what the issue asks of each framework (70 % LangChain and
    # Haystack, 60 % LlamaIndex, whose prompts carry more text after the documents).
    assert reuse.cached_tokens >= share * reuse.prompt_tokens, reuse


# --- (a) LangChain -----------------------------------------------------------------------

# LangChain's `langchain-ai/retrieval-qa-chat` hub prompt, the one its
# `create_retrieval_chain` documentation stuffs documents into (the hub needs network:
# written out here).
RETRIEVAL_QA_CHAT = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "Answer any use questions based solely on the context below:\n\n"
            "<context>\n{context}\n</context>",
        ),
        ("placeholder", "{chat_history}"),
        ("human", "{input}"),
    ]
)
# The documents in the user's message, before the question.
DOCUMENTS_THEN_QUESTION = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer the question from the documents in the user's message."),
        ("human", "{context}\n\nQuestion: {input}"),
    ]
)


# `format_document` with metadata: a document prompt naming each document's source, on
# the line before its text or in a block of its own.
SOURCE_LINE = PromptTemplate.from_template("Source: {source}\n{page_content}")
SOURCE_BLOCK = PromptTemplate.from_template("Source: {source}\n\n{page_content}")


@order_param
@pytest.mark.parametrize(
    ("prompt", "document_prompt", "layout"),
    [
        pytest.param(DOCUMENTS_THEN_QUESTION, None, "blank", id="documents-then-question"),
        # the documents joined by blank lines inside <context>, in the system message
        pytest.param(RETRIEVAL_QA_CHAT, None, "xml", id="retrieval-qa-chat"),
        pytest.param(DOCUMENTS_THEN_QUESTION, SOURCE_LINE, "blank", id="source-line"),
        pytest.param(DOCUMENTS_THEN_QUESTION, SOURCE_BLOCK, "blank", id="source-block"),
    ],
)
async def test_langchain_stuff_documents_chain(
    proxy_factory: ProxyFactory,
    prompt: ChatPromptTemplate,
    document_prompt: PromptTemplate | None,
    layout: str,
    order: str,
) -> None:
    proxy = await proxy_factory()
    llm = ChatOpenAI(
        base_url=proxy.url + "/v1", api_key="x", model="m", max_tokens=MAX_TOKENS, max_retries=0
    )
    # documents joined with "\n\n", each formatted as its page_content (the defaults)
    # or by `document_prompt`
    extra = {"document_prompt": document_prompt} if document_prompt is not None else {}
    chain = create_stuff_documents_chain(llm, prompt, **extra)

    def ask(docs: list[str], question: str) -> tuple[int, int]:
        usage = UsageMetadataCallbackHandler()
        documents = [
            Document(page_content=d, metadata={"source": f"bridges/{DOCS.index(d)}.md"})
            for d in docs
        ]
        with tracing_context(enabled=False):  # LangSmith, even where LANGSMITH_TRACING is set
            chain.invoke({"context": documents, "input": question}, config={"callbacks": [usage]})
        reported = usage.usage_metadata["m"]
        return reported["input_tokens"], reported["input_token_details"]["cache_read"]

    assert_documents_reused(await second_call_reuse(proxy, ask, order), layout, 0.7)


# LangChain's RAG tutorial (its agent-free chain): the instruction, a blank line, then
# the retrieved documents' page_content joined by blank lines, all in the system
# message; the conversation's question after it.
RAG_TUTORIAL_SYSTEM = (
    "You are an assistant for question-answering tasks. "
    "Use the following pieces of retrieved context to answer "
    "the question. If you don't know the answer, say that you "
    "don't know. Use three sentences maximum and keep the "
    "answer concise."
    "\n\n"
)


@order_param
async def test_langchain_rag_tutorial(proxy_factory: ProxyFactory, order: str) -> None:
    proxy = await proxy_factory()
    llm = ChatOpenAI(
        base_url=proxy.url + "/v1", api_key="x", model="m", max_tokens=MAX_TOKENS, max_retries=0
    )

    def ask(docs: list[str], question: str) -> tuple[int, int]:
        documents = [Document(page_content=d) for d in docs]
        docs_content = "\n\n".join(doc.page_content for doc in documents)
        messages = [SystemMessage(RAG_TUTORIAL_SYSTEM + docs_content), HumanMessage(question)]
        with tracing_context(enabled=False):
            reply = llm.invoke(messages)
        usage = reply.usage_metadata
        assert usage is not None
        return usage["input_tokens"], usage["input_token_details"]["cache_read"]

    assert_documents_reused(await second_call_reuse(proxy, ask, order), "blank", 0.7)


# --- (b) LlamaIndex ----------------------------------------------------------------------


def node_metadata(kind: str | None, index: int) -> dict[str, str]:
    """A node's metadata as LlamaIndex's readers set it (None: none)."""
    if kind == "file":
        return {"file_path": f"data/bridges/{index}.txt"}
    if kind == "pdf":
        return {"page_label": str(3 + index), "file_path": "data/bridges.pdf"}
    return {}


@order_param
@pytest.mark.parametrize(
    "metadata", [None, "file", "pdf"], ids=["text", "metadata", "pdf-metadata"]
)
async def test_llama_index_text_qa(
    proxy_factory: ProxyFactory, monkeypatch: pytest.MonkeyPatch, order: str, metadata: str | None
) -> None:
    """The compact response synthesizer over given nodes (no index, no embeddings): a
    chat model gets LlamaIndex's default text-QA prompt (a system message, then the
    context between dashed rules and the query). With `metadata`, each node carries a
    file path as a directory reader sets it, and the prompt renders it as LlamaIndex
    does by default (`MetadataMode.LLM`: the "file_path: ..." line, a blank line, the
    text), so each document is two blank-line blocks; a PDF reader's nodes carry a page
    label too (two metadata lines). Its response has no usage: the
    proxy's metrics count the second call."""
    # Unset, llama-index-core points tiktoken at the cl100k_base file in its own wheel.
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    proxy = await proxy_factory()
    llm = OpenAILike(
        api_base=proxy.url + "/v1",
        api_key="x",
        model="m",
        is_chat_model=True,
        max_tokens=MAX_TOKENS,
        max_retries=0,
    )
    synthesizer = get_response_synthesizer(llm=llm, response_mode="compact")

    def ask(docs: list[str], question: str) -> None:
        nodes = [
            NodeWithScore(
                node=TextNode(
                    text=d,
                    metadata=node_metadata(metadata, DOCS.index(d)),
                ),
                score=1.0,
            )
            for d in docs
        ]
        synthesizer.synthesize(question, nodes=nodes)

    assert_documents_reused(await second_call_reuse(proxy, ask, order), "dashed", 0.6)


# --- (c) Haystack ------------------------------------------------------------------------

# Haystack's RAG tutorial ("Creating Your First QA Pipeline with Retrieval-Augmentation")
GIVEN_THE_FOLLOWING = """
Given the following information, answer the question.

Context:
{% for document in documents %}
    {{ document.content }}
{% endfor %}

Question: {{question}}
Answer:
"""
# The tutorial's template with each document's meta, as its later chapters write it.
WITH_META = """
Given the following information, answer the question.

Context:
{% for document in documents %}
    Title: {{ document.meta['title'] }}

    {{ document.content }}
{% endfor %}

Question: {{question}}
Answer:
"""
# The template with document meta in PromptBuilder's own docstring (haystack-ai 2.x,
# "Changing the template at runtime"): indented, each document numbered by the loop.
DOCSTRING_META = """
    You are a helpful assistant.
    Given these documents, answer the question.
    Documents:
    {% for doc in documents %}
        Document {{ loop.index }}:
        Document name: {{ doc.meta['title'] }}
        {{ doc.content }}
    {% endfor %}

    Question: {{ question }}
    Answer:
    """
# The instruction as a system message, the documents first in the user's.
DOCUMENTS_LOOP_THEN_QUESTION = """{% for document in documents %}{{ document.content }}

{% endfor %}Question: {{question}}
Answer:"""


def haystack_pipeline(proxy: RunningProxy, messages: list[tuple[str, str]]) -> Pipeline:
    """A `ChatPromptBuilder` (one template per (role, text)) feeding an
    `OpenAIChatGenerator` pointed at the proxy, in a `Pipeline`."""
    build = {"system": ChatMessage.from_system, "user": ChatMessage.from_user}
    template = [build[role](text) for role, text in messages]
    pipeline = Pipeline()
    pipeline.add_component("prompt_builder", ChatPromptBuilder(template, required_variables="*"))
    generator = OpenAIChatGenerator(
        api_key=Secret.from_token("x"),
        model="m",
        api_base_url=proxy.url + "/v1",
        generation_kwargs={"max_tokens": MAX_TOKENS},
        max_retries=0,
    )
    pipeline.add_component("llm", generator)
    pipeline.connect("prompt_builder.prompt", "llm.messages")
    return pipeline


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param(
            [
                ("system", "Given the following information, answer the question."),
                ("user", DOCUMENTS_LOOP_THEN_QUESTION),
            ],
            id="documents-then-question",
        ),
        # Haystack's tutorial: the instruction and "Context:" are blank-line blocks that
        # always travel together (fixed, in front); the documents move.
        pytest.param([("user", GIVEN_THE_FOLLOWING)], id="tutorial"),
        # and with each document's title, a block of its own before the text
        pytest.param([("user", WITH_META)], id="tutorial-meta"),
        pytest.param([("user", DOCSTRING_META)], id="docstring-meta"),
    ],
)
@order_param
async def test_haystack_prompt_builder_pipeline(
    proxy_factory: ProxyFactory, messages: list[tuple[str, str]], order: str
) -> None:
    layout = "numbered" if "loop.index" in messages[-1][1] else "blank"
    proxy = await proxy_factory()
    pipeline = haystack_pipeline(proxy, messages)

    def ask(docs: list[str], question: str) -> tuple[int, int]:
        documents = [
            HaystackDocument(content=d, meta={"title": d.split(" is ")[0].split(" carries")[0]})
            for d in docs
        ]
        result = pipeline.run({"prompt_builder": {"documents": documents, "question": question}})
        usage = result["llm"]["replies"][0].meta["usage"]
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

    assert_documents_reused(await second_call_reuse(proxy, ask, order), layout, 0.7)


# --- (d) OpenAI Agents SDK ---------------------------------------------------------------


@function_tool
def opened_in(bridge: str) -> str:
    """The year a bridge opened to traffic."""
    return "1607"


async def test_openai_agents_tool_loop(proxy_factory: ProxyFactory) -> None:
    """The agent loop's second model call (after the tool call and its result) starts
    with the first call's whole prompt, which the engine has cached."""
    set_tracing_disabled(True)
    proxy = await proxy_factory()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        agent = Agent(
            name="Bridges",
            instructions="You answer questions about bridges. Look facts up with the tool.",
            tools=[opened_in],
            model=OpenAIChatCompletionsModel(model="m", openai_client=client),
            # "required" on the first call only: the SDK resets it once a tool was used
            # (`reset_tool_choice`), so the second call answers in text and the run ends.
            model_settings=ModelSettings(tool_choice="required", max_tokens=64),
        )
        result = await Runner.run(agent, "When did the Pont Neuf open?")
    first, second = result.raw_responses
    call = first.output[0]
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "opened_in", first.output
    assert result.final_output, result
    # SGLang (and the simulated engine) match all of a prompt but its last token; the
    # second prompt extends the first, whose tokens the engine cached when it finished.
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens > 0, (first.usage, second.usage)
    assert second.usage.input_tokens > first.usage.input_tokens


SEARCHES: list[list[int]] = []  # the order of each search's results, one per call


@function_tool
def search(query: str) -> list[dict[str, str]]:
    """Search the bridge encyclopedia; the passages found, best first."""
    order = [[0, 1, 2, 3], [2, 0, 3, 1], [1, 2, 3, 0]][len(SEARCHES) % 3]
    SEARCHES.append(order)
    return [{"title": DOCS[i].split(" is ")[0][:24], "text": DOCS[i]} for i in order]


def after_three_searches(
    context: RunContextWrapper[Any], results: list[FunctionToolResult]
) -> ToolsToFinalOutputResult:
    return ToolsToFinalOutputResult(is_final_output=len(SEARCHES) >= 3, final_output="done")


async def test_openai_agents_search_tool_history_stays_cached(
    proxy_factory: ProxyFactory,
) -> None:
    """An agent whose search tool returns documents (a list of dicts, which the SDK
    sends as `str(value)`) searches three times, the same documents in three orders.
    Every model call caches the whole earlier call's prompt: each tool result is served
    in one order every time it is re-sent."""
    set_tracing_disabled(True)
    SEARCHES.clear()
    proxy = await proxy_factory()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        agent = Agent(
            name="Researcher",
            instructions="You answer questions about bridges. Search before you answer.",
            tools=[search],
            model=OpenAIChatCompletionsModel(model="m", openai_client=client),
            model_settings=ModelSettings(tool_choice="required", max_tokens=64),
            reset_tool_choice=False,
            tool_use_behavior=after_three_searches,
        )
        result = await Runner.run(agent, "Which bridge is the oldest?")
    calls = result.raw_responses
    assert len(calls) == 3 and len(SEARCHES) == 3, calls
    for earlier, later in itertools.pairwise(calls):
        cached = later.usage.input_tokens_details.cached_tokens
        assert cached >= earlier.usage.input_tokens > 0, (earlier.usage, later.usage)
    stats = proxy.app[GATEWAY].tool_results.stats()
    # each result arranged when first sent; the first, re-sent in the third call,
    # served as before
    assert stats["arranged"] == 2 and stats["repeated"] == 1, stats
