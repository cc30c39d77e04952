"""Passage pools for the RAG trace: a user's MultiHop-RAG corpus, or seeded filler.

MultiHop-RAG's ``corpus.json`` is a JSON list of articles, each with a ``body`` (and a
``title``, ``source``, …). Each body is cut into consecutive chunks of at most
``chunk_tokens`` tokens at word boundaries (the paper's 128-token retrieval chunks);
a trailing piece shorter than a quarter chunk is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from loadgen.workloads.textgen import TokenCounter, fit_words, random_text


def chunk_text(tokenizer: TokenCounter, text: str, chunk_tokens: int) -> list[str]:
    """Consecutive whole-word chunks of at most ``chunk_tokens`` tokens each."""
    words = text.split()
    chunks: list[str] = []
    while words:
        window = words[: chunk_tokens * 2]
        chunk = fit_words(tokenizer, window, chunk_tokens)
        taken = len(chunk.split()) if chunk else 1  # a single over-long word: keep it alone
        if not chunk:
            chunk = words[0]
        chunks.append(chunk)
        words = words[taken:]
    if len(chunks) > 1 and len(tokenizer.encode(chunks[-1])) < chunk_tokens // 4:
        chunks.pop()
    return chunks


def load_corpus(
    tokenizer: TokenCounter, path: Path, chunk_tokens: int, limit: int | None = None
) -> list[str]:
    """Chunks of a MultiHop-RAG-style ``corpus.json``, in article order.

    ``limit`` keeps the first ``limit`` chunks (the pool size ``P``).
    """
    articles = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(articles, list):
        raise ValueError(f"{path}: expected a JSON list of articles")
    chunks: list[str] = []
    for number, article in enumerate(articles):
        if not isinstance(article, dict) or not isinstance(article.get("body"), str):
            raise ValueError(f"{path}: article {number} has no text 'body'")
        chunks.extend(chunk_text(tokenizer, article["body"], chunk_tokens))
        if limit is not None and len(chunks) >= limit:
            return chunks[:limit]
    if not chunks:
        raise ValueError(f"{path}: no passages")
    return chunks


def synthetic_passages(
    tokenizer: TokenCounter, rng: np.random.Generator, count: int, chunk_tokens: int
) -> list[str]:
    """``count`` distinct seeded passages of about ``chunk_tokens`` tokens each."""
    return [random_text(tokenizer, rng, chunk_tokens) for _ in range(count)]
