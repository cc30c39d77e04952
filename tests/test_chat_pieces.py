"""Rendered chats tokenized piece by piece: the same ids as the library's
whole-text encode, for every tokenizer where the cut is accepted, and no cut where it
would change the ids."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_dirs import LLAMA_SPECIALS, TRAIN_TEXT, write_bpe_dir, write_wordpiece_dir
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from prism_tokens.chat_pieces import ChatPieces
from prism_tokens.tokenizer import Tokenizer as ProxyTokenizer
from prism_tokens.tokenizer import load_model_dir, load_tokenizer

CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
WORDS = st.sampled_from(["user\n", "assistant\n", " ", "\n\n", "the quick", "Fox!", "é漢🙂", "12"])


def _texts(specials: list[str]) -> st.SearchStrategy[str]:
    piece = st.one_of(st.text(max_size=30), WORDS, st.sampled_from(specials))
    return st.lists(piece, max_size=14).map("".join)


def _whole(tokenizer: ProxyTokenizer, text: str) -> list[int]:
    return tokenizer._backend.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def builtin() -> ProxyTokenizer:
    return load_tokenizer("builtin")


@pytest.fixture(scope="module")
def llama_like(tmp_path_factory: pytest.TempPathFactory) -> ProxyTokenizer:
    return load_model_dir(write_bpe_dir(tmp_path_factory.mktemp("bpe")))


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory: pytest.TempPathFactory) -> ProxyTokenizer:
    return load_model_dir(write_wordpiece_dir(tmp_path_factory.mktemp("wp")))


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(_texts(CHATML), min_size=1, max_size=4))
def test_builtin_pieces_give_the_whole_texts_ids(builtin: ProxyTokenizer, texts: list[str]) -> None:
    assert builtin.chat_pieces is not None
    for text in texts + texts:  # the second time from the cache
        assert builtin.encode_chat(text) == _whole(builtin, text)


@settings(max_examples=150, deadline=None)
@given(text=_texts(LLAMA_SPECIALS))
def test_llama_like_pieces_give_the_whole_texts_ids(llama_like: ProxyTokenizer, text: str) -> None:
    assert llama_like.chat_pieces is not None
    assert llama_like.encode_chat(text) == _whole(llama_like, text)
    assert llama_like.encode_chat(text) == _whole(llama_like, text)


@settings(max_examples=150, deadline=None)
@given(text=_texts(["[SEP]", "[UNK]"]))
def test_wordpiece_pieces_give_the_whole_texts_ids(wordpiece: ProxyTokenizer, text: str) -> None:
    assert wordpiece.chat_pieces is not None
    assert wordpiece.encode_chat(text) == _whole(wordpiece, text)


def test_a_multi_turn_chat_encodes_only_its_new_messages(builtin: ProxyTokenizer) -> None:
    pieces = ChatPieces.for_tokenizer(builtin._backend)
    assert pieces is not None
    history = [{"role": "system", "content": "You are a careful agent. " * 50}]
    for turn in range(6):
        history.append({"role": "user", "content": f"question {turn}: what next?"})
        text = builtin.render_chat(history)
        before = pieces.info()
        assert pieces.encode(text) == _whole(builtin, text)
        after = pieces.info()
        # New this turn: the user message; the first time also the system message,
        # the "\n" between messages and the generation prompt's "assistant\n".
        assert after["misses"] - before["misses"] == (4 if turn == 0 else 1)
        history.append({"role": "assistant", "content": f"answer {turn}"})
        pieces.encode(builtin.render_chat(history))  # the answer's piece, seen once


def _metaspace_first() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    return tok


def test_metaspace_first_is_not_cut() -> None:
    tok = _metaspace_first()
    text = "<s>the quick</s>brown fox"
    # Cut outside the library, each piece would count as the text's first: other ids.
    cut = [i for part in ("<s>", "the quick", "</s>", "brown fox") for i in tok.encode(part).ids]
    assert cut != tok.encode(text).ids
    assert ChatPieces.for_tokenizer(tok) is None
    proxy_tokenizer = ProxyTokenizer("metaspace-first", tok)
    assert proxy_tokenizer.chat_pieces is None
    assert proxy_tokenizer.encode_chat(text) == tok.encode(text).ids


@pytest.mark.parametrize(
    "token",
    [
        AddedToken("<tool>", lstrip=True, special=True),
        AddedToken("<tool>", rstrip=True, special=True),
        AddedToken("<tool>", single_word=True, special=True),
        AddedToken("<tool>", normalized=True, special=False),
    ],
    ids=["lstrip", "rstrip", "single_word", "normalized"],
)
def test_added_tokens_the_library_matches_differently_are_not_cut(
    tmp_path: Path, token: AddedToken
) -> None:
    tok = Tokenizer.from_file(str(write_bpe_dir(tmp_path) / "tokenizer.json"))
    tok.add_tokens([token])
    assert ChatPieces.for_tokenizer(tok) is None
    text = "the quick <tool> brown<tool>fox"
    assert ProxyTokenizer("stripping", tok).encode_chat(text) == tok.encode(text).ids


def test_the_cache_stays_within_its_capacity_and_forgets_the_oldest(
    builtin: ProxyTokenizer,
) -> None:
    pieces = ChatPieces.for_tokenizer(builtin._backend, capacity_bytes=600)
    assert pieces is not None
    texts = [f"<|im_start|>user\nmessage number {n} " + "x" * 20 for n in range(10)]
    for text in texts:
        assert pieces.encode(text) == _whole(builtin, text)
        assert 0 < pieces.info()["bytes"] <= 600
    assert pieces.info()["entries"] < len(texts)
    hits = pieces.info()["hits"]
    pieces.encode(texts[-1])  # recent: still held
    assert pieces.info()["hits"] == hits + 1
    pieces.encode(texts[0])  # the oldest: evicted, encoded again
    assert pieces.info()["hits"] == hits + 1
    huge = "<|im_start|>" + "y" * 1000
    assert pieces.encode(huge) == _whole(builtin, huge)  # larger than the cache: not held
    assert pieces.info()["bytes"] <= 600


def test_threads_sharing_the_cache_get_the_right_ids(builtin: ProxyTokenizer) -> None:
    pieces = ChatPieces.for_tokenizer(builtin._backend, capacity_bytes=4_000)
    assert pieces is not None
    texts = [
        f"<|im_start|>system\nshared {n % 7}<|im_end|>\n<|im_start|>user\n{n}" * 3
        for n in range(400)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(pieces.encode, texts))
    assert results == [_whole(builtin, text) for text in texts]
    info = pieces.info()
    assert info["hits"] > 0 and info["bytes"] <= 4_000
