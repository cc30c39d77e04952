"""Real framework clients, unmodified, through the proxy to a real, unmodified SGLang
0.5.23 on this CPU: LangChain's `ChatOpenAI` in a stuff-documents chain (documents in
the user message; its retrieval-QA chat prompt, documents in the system message) and as
its RAG tutorial calls it (the instruction and the documents joined by blank lines in
the system message); LlamaIndex's compact synthesizer with its default text-QA prompt,
nodes carrying a file path. The second call sends the same documents in another order;
the proxy finds them, serves them in the order the engine cached, and SGLang reports
the reuse in `cached_tokens` (LlamaIndex's response has none: the proxy's own count of
SGLang's reports). (tests/test_frameworks.py runs all four frameworks against
prism-sim.)"""

from __future__ import annotations

import asyncio

import pytest
from live_support import LiveServer
from proxy_support import metric_total

pytestmark = pytest.mark.sglang

DOCS = [
    "The river Osse rises in the Pellan hills and flows north for ninety kilometres "
    "before it reaches the Calder Sea below the old mill at Amble.",
    "Two stone bridges cross the Osse: the Rowe bridge, built in 1731 with five arches, "
    "and the narrower bridge at Amble, rebuilt after the flood of 1902.",
    "The mill at Amble ground grain for three villages until 1954; its wheel, restored "
    "in 1988, still turns on summer weekends for visitors.",
]


# the second call's order: runs of the first kept together, or no pair kept
ORDERS = {"rotated": [1, 2, 0], "shuffled": [1, 0, 2]}


@pytest.fixture
async def proxy(live: dict[str, LiveServer], live_proxy_factory):
    live["ample"].fresh()
    return await live_proxy_factory(live["ample"])


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("where", ["user", "system", "rag-tutorial"])
async def test_langchain_reuses_the_documents_in_another_order(
    proxy, where: str, order: str
) -> None:
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.callbacks import UsageMetadataCallbackHandler
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI
    from langsmith import tracing_context

    if where == "user":
        messages = [
            ("system", "Answer the question from the documents in the user's message."),
            ("human", "{context}\n\nQuestion: {input}"),
        ]
    elif where == "system":  # LangChain's retrieval-QA chat prompt
        messages = [
            (
                "system",
                "Answer any use questions based solely on the context below:\n\n"
                "<context>\n{context}\n</context>",
            ),
            ("human", "{input}"),
        ]
    else:  # its RAG tutorial: no tags, the documents after the instruction
        messages = [
            (
                "system",
                "You are an assistant for question-answering tasks. Use the following "
                "pieces of retrieved context to answer the question. If you don't know "
                "the answer, say that you don't know. Use three sentences maximum and "
                "keep the answer concise.\n\n{context}",
            ),
            ("human", "{input}"),
        ]
    llm = ChatOpenAI(
        base_url=proxy.url + "/v1", api_key="x", model="m", max_tokens=4, max_retries=0
    )
    chain = create_stuff_documents_chain(llm, ChatPromptTemplate.from_messages(messages))

    def ask(docs: list[str], question: str) -> tuple[int, int]:
        usage = UsageMetadataCallbackHandler()
        documents = [Document(page_content=d) for d in docs]
        with tracing_context(enabled=False):
            chain.invoke({"context": documents, "input": question}, config={"callbacks": [usage]})
        (reported,) = usage.usage_metadata.values()
        return reported["input_tokens"], reported["input_token_details"]["cache_read"]

    await asyncio.to_thread(ask, DOCS, "Where does the Osse flow?")
    second = [DOCS[i] for i in ORDERS[order]]
    prompt, cached = await asyncio.to_thread(ask, second, "When was the Rowe bridge built?")
    # the head, the text before the documents and the three documents came from
    # SGLang's cache; the question and what follows it did not
    assert cached >= 0.7 * prompt, (prompt, cached)


async def proxy_tokens(proxy) -> tuple[int, int]:
    """(prompt, cached) tokens the proxy counted from SGLang's reports."""
    import httpx

    async with httpx.AsyncClient() as http:
        text = (await http.get(proxy.url + "/metrics")).text
    prompt = metric_total(text, "prism:prompt_tokens_total")
    return int(prompt), int(metric_total(text, "prism:cached_tokens_total"))


@pytest.mark.parametrize("order", list(ORDERS))
async def test_llama_index_reuses_the_documents_in_another_order(
    proxy, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index.core import get_response_synthesizer
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.llms.openai_like import OpenAILike

    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)  # its own cl100k_base file
    llm = OpenAILike(
        api_base=proxy.url + "/v1",
        api_key="x",
        model="m",
        is_chat_model=True,
        max_tokens=4,
        max_retries=0,
    )
    synthesizer = get_response_synthesizer(llm=llm, response_mode="compact")

    def ask(docs: list[str], question: str) -> None:
        nodes = [
            NodeWithScore(
                node=TextNode(text=d, metadata={"file_path": f"data/osse/{DOCS.index(d)}.txt"}),
                score=1.0,
            )
            for d in docs
        ]
        synthesizer.synthesize(question, nodes=nodes)

    await asyncio.to_thread(ask, DOCS, "Where does the Osse flow?")
    before = await proxy_tokens(proxy)
    await asyncio.to_thread(
        ask, [DOCS[i] for i in ORDERS[order]], "When was the Rowe bridge built?"
    )
    after = await proxy_tokens(proxy)
    prompt, cached = after[0] - before[0], after[1] - before[1]
    assert cached >= 0.6 * prompt, (prompt, cached)
