"""A real framework client, unmodified, through the proxy to a real, unmodified SGLang
0.5.23 on this CPU: LangChain's `ChatOpenAI` in a stuff-documents chain, with
its documents in the user message and with its retrieval-QA chat prompt (documents in
the system message). The second call sends the same documents in reverse order; the
proxy finds them, serves them in the order the engine cached, and SGLang reports the
reuse in `cached_tokens`. (tests/test_frameworks.py runs all four frameworks against
prism-sim.)"""

from __future__ import annotations

import asyncio

import pytest
from live_support import LiveServer

pytestmark = pytest.mark.sglang

DOCS = [
    "The river Osse rises in the Pellan hills and flows north for ninety kilometres "
    "before it reaches the Calder Sea below the old mill at Amble.",
    "Two stone bridges cross the Osse: the Rowe bridge, built in 1731 with five arches, "
    "and the narrower bridge at Amble, rebuilt after the flood of 1902.",
    "The mill at Amble ground grain for three villages until 1954; its wheel, restored "
    "in 1988, still turns on summer weekends for visitors.",
]


@pytest.fixture
async def proxy(live: dict[str, LiveServer], live_proxy_factory):
    live["ample"].fresh()
    return await live_proxy_factory(live["ample"])


@pytest.mark.parametrize("where", ["user", "system"])
async def test_langchain_reuses_the_documents_in_another_order(proxy, where: str) -> None:
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
    else:  # LangChain's retrieval-QA chat prompt
        messages = [
            (
                "system",
                "Answer any use questions based solely on the context below:\n\n"
                "<context>\n{context}\n</context>",
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
    prompt, cached = await asyncio.to_thread(ask, DOCS[::-1], "When was the Rowe bridge built?")
    # the head, the text before the documents and the three documents came from
    # SGLang's cache; the question and what follows it did not
    assert cached >= 0.7 * prompt, (prompt, cached)
