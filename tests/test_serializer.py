"""Serializer (SPEC §1): per-piece tokenization, exact anchors, shared
prefixes, reordering and the segment cache, for three kinds of tokenizer: the builtin
byte-level BPE (ChatML), a model directory with a Llama-like template, and a WordPiece
with whitespace pre-tokenization (which drops the separator entirely)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_dirs import write_bpe_dir, write_wordpiece_dir

from prism_proxy.api.segments import Segment, SegmentedPrompt
from prism_proxy.prompts.serializer import (
    SEGMENT_SEPARATOR,
    SerializationError,
    SerializedPrompt,
    Serializer,
    prefix_key_of,
)
from prism_tokens.byte_lru import ByteLRU
from prism_tokens.tokenizer import ChatTemplateError, Tokenizer, load_model_dir, load_tokenizer
from prism_wire import Anchor, AnchorKind

TEST_SENTINEL = "\x00test-sentinel\x00"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("models")
    return {
        "builtin": load_tokenizer("builtin"),
        "bpe-dir": load_tokenizer(str(write_bpe_dir(root / "bpe"))),
        "wordpiece": load_model_dir(write_wordpiece_dir(root / "wp")),
    }


@pytest.fixture(scope="module")
def serializers(tokenizers: dict[str, Tokenizer]) -> dict[str, Serializer]:
    return {
        name: Serializer(tok, segment_cache_bytes=64 * 1024) for name, tok in tokenizers.items()
    }


texts = st.text(st.characters(codec="utf-8"), max_size=30)
ids = st.text("abcdefgh", min_size=1, max_size=3)


def _prompt(
    system: str | None, segments: Sequence[tuple[str, str]], suffix: str, reorder: bool = True
) -> SegmentedPrompt:
    return SegmentedPrompt(
        system=system,
        segments=[Segment(id=i, text=t) for i, t in segments],
        suffix=suffix,
        reorder=reorder,
    )


@st.composite
def prompts(draw: st.DrawFn) -> SegmentedPrompt:
    seg_ids = draw(st.lists(ids, unique=True, max_size=5))
    return _prompt(draw(st.none() | texts), [(i, draw(texts)) for i in seg_ids], draw(texts))


def _pieces(tok: Tokenizer, prompt: SegmentedPrompt, order: Sequence[str], chat: bool) -> list[str]:
    """The SPEC §1 pieces, derived here independently of the serializer's code."""
    if chat:
        messages = [] if prompt.system is None else [{"role": "system", "content": prompt.system}]
        rendered = tok.render_chat([*messages, {"role": "user", "content": TEST_SENTINEL}])
        head, after = rendered.split(TEST_SENTINEL)
    else:
        head, after = prompt.system or "", ""
    texts_by_id = {s.id: s.text for s in prompt.segments}
    return [head, *(texts_by_id[i] + SEGMENT_SEPARATOR for i in order), prompt.suffix + after]


def _shared_offset(serialized: SerializedPrompt, shared: Sequence[str]) -> int:
    return serialized.head_tokens + sum(serialized.segment_tokens[i] for i in shared)


@settings(max_examples=60, deadline=None)
@given(prompt=prompts(), chat=st.booleans(), data=st.data())
def test_anchors_are_exact(
    serializers: dict[str, Serializer], prompt: SegmentedPrompt, chat: bool, data: st.DataObject
) -> None:
    order = data.draw(st.permutations(prompt.segment_ids))
    for serializer in serializers.values():
        tok = serializer.tokenizer
        out = serializer.serialize(prompt, order=order, chat=chat)
        pieces = [tok.encode(p) for p in _pieces(tok, prompt, order, chat)]
        assert out.input_ids == [t for piece in pieces for t in piece]
        kinds = ["system", *(["segment"] * len(order)), "private"]
        # the system anchor names its head by prefix_key (DART's per-head owner)
        owners = [prefix_key_of(pieces[0]), *order, None]
        expected, offset = [], 0
        for piece, kind, owner in zip(pieces, kinds, owners, strict=True):
            offset += len(piece)
            if piece:  # a piece with no tokens has no anchor
                expected.append((kind, owner, offset))
        assert [(a.kind, a.segment_id, a.offset) for a in out.anchors] == expected
        assert out.head_tokens == len(pieces[0])
        assert out.tail_tokens == len(pieces[-1])
        assert out.segment_tokens == {i: len(p) for i, p in zip(order, pieces[1:-1], strict=True)}
        assert out.prefix_key == prefix_key_of(pieces[0])
        assert out.order == tuple(order)


@settings(max_examples=60, deadline=None)
@given(
    system=st.none() | texts,
    seg_ids=st.lists(ids, unique=True, max_size=8),
    data=st.data(),
    chat=st.booleans(),
)
def test_shared_segments_give_shared_prefix(
    serializers: dict[str, Serializer],
    system: str | None,
    seg_ids: list[str],
    data: st.DataObject,
    chat: bool,
) -> None:
    # Two requests share the first j segments (same ids, texts and order) and the system
    # prompt; what follows (other segments, other texts under other ids, suffix) differs.
    j = data.draw(st.integers(0, len(seg_ids)), label="j")
    shared = [(i, data.draw(texts)) for i in seg_ids[:j]]
    rest = seg_ids[j:]
    one = _prompt(system, shared + [(i, data.draw(texts)) for i in rest], data.draw(texts))
    rest_two = data.draw(st.permutations(rest))[: data.draw(st.integers(0, len(rest)))]
    two = _prompt(system, shared + [(i, data.draw(texts)) for i in rest_two], data.draw(texts))
    shared_ids = [i for i, _ in shared]
    for serializer in serializers.values():
        a, b = serializer.serialize(one, chat=chat), serializer.serialize(two, chat=chat)
        offset = _shared_offset(a, shared_ids)
        assert offset == _shared_offset(b, shared_ids)
        assert a.input_ids[:offset] == b.input_ids[:offset]
        assert [x for x in a.anchors if x.offset <= offset] == [
            x for x in b.anchors if x.offset <= offset
        ]
        if j and a.segment_tokens[shared_ids[-1]]:
            # The j-th segment's anchor sits exactly at the end of the shared prefix.
            assert next(x for x in a.anchors if x.segment_id == shared_ids[-1]).offset == offset


@settings(max_examples=60, deadline=None)
@given(prompt=prompts(), chat=st.booleans(), data=st.data())
def test_reordering_permutes_segment_blocks(
    serializers: dict[str, Serializer], prompt: SegmentedPrompt, chat: bool, data: st.DataObject
) -> None:
    order = data.draw(st.permutations(prompt.segment_ids))
    for serializer in serializers.values():
        base = serializer.serialize(prompt, chat=chat)
        moved = serializer.serialize(prompt, order=order, chat=chat)
        assert base.order == tuple(prompt.segment_ids)

        def blocks(out: SerializedPrompt) -> dict[str, list[int]]:
            found, start = {}, out.head_tokens
            for seg_id in out.order:
                found[seg_id] = out.input_ids[start : start + out.segment_tokens[seg_id]]
                start += out.segment_tokens[seg_id]
            return found

        assert blocks(moved) == blocks(base)
        h, t = base.head_tokens, base.tail_tokens
        assert moved.input_ids[:h] == base.input_ids[:h]
        assert (
            moved.input_ids[len(moved.input_ids) - t :] == base.input_ids[len(base.input_ids) - t :]
        )
        assert moved.input_ids == [
            *base.input_ids[:h],
            *(tok for seg_id in order for tok in blocks(base)[seg_id]),
            *base.input_ids[len(base.input_ids) - t :],
        ]


@settings(max_examples=40, deadline=None)
@given(prompt=prompts(), chat=st.booleans(), edit=texts.filter(bool))
def test_cache_hits_are_identical_and_edits_are_not_stale(
    tokenizers: dict[str, Tokenizer], prompt: SegmentedPrompt, chat: bool, edit: str
) -> None:
    for tok in tokenizers.values():
        serializer = Serializer(tok)
        first = serializer.serialize(prompt, chat=chat)
        hits = serializer.cache_stats()["segments"]["hits"]
        again = serializer.serialize(prompt, chat=chat)
        assert again == first
        assert serializer.cache_stats()["segments"]["hits"] == hits + len(prompt.segments)
        # Same ids, new texts: must equal what a fresh serializer produces.
        edited = _prompt(
            prompt.system, [(s.id, s.text + edit) for s in prompt.segments], prompt.suffix
        )
        assert serializer.serialize(edited, chat=chat) == Serializer(tok).serialize(
            edited, chat=chat
        )
        misses = serializer.cache_stats()["segments"]["misses"]
        lengths = serializer.skeleton_lengths(edited)
        assert serializer.cache_stats()["segments"]["misses"] == misses  # served from the cache
        assert lengths == Serializer(tok).serialize(edited, chat=chat).segment_tokens


def test_builtin_serialization_decodes_to_the_rendered_chat(
    tokenizers: dict[str, Tokenizer],
) -> None:
    tok = tokenizers["builtin"]
    prompt = _prompt("Answer briefly.", [("d1", "Cats purr."), ("d2", "Dogs bark.")], "Who purrs?")
    out = Serializer(tok).serialize(prompt, order=["d2", "d1"])
    user = "Dogs bark.\n\nCats purr.\n\nWho purrs?"
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": user}]
    assert tok.decode(out.input_ids) == tok.render_chat(messages)
    assert [a.kind for a in out.anchors] == ["system", "segment", "segment", "private"]
    assert out.anchors[-1].offset == len(out.input_ids)
    assert out.anchors[1] == Anchor(AnchorKind.SEGMENT, "d2", out.anchors[1].offset)


def test_extracted_layouts_serialize_to_the_clients_own_text(
    tokenizers: dict[str, Tokenizer],
) -> None:
    """Segments found in a client's text (a preamble before them, their own separators,
    numbered labels): served in the client's order, the prompt reads exactly as the
    client wrote it; reordered, the labels follow the positions, so the model reads
    [1], [2] in order; fixed segments keep their order."""
    tok = tokenizers["builtin"]
    prompt = SegmentedPrompt(
        system="Answer briefly.",
        preamble="Context:\n",
        segments=[
            Segment(id="a", text="Cats purr.\n"),
            Segment(id="b", text="Dogs bark.\n"),
            Segment(id="c", text="Owls hoot.\n"),
        ],
        suffix="\nWho purrs?",
        separator="",
        label_format="[{n}] ",
        fixed=frozenset({"b", "c"}),
    )
    serializer = Serializer(tok)
    user = "Context:\n[1] Cats purr.\n[2] Dogs bark.\n[3] Owls hoot.\n\nWho purrs?"
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": user}]
    assert tok.decode(serializer.serialize(prompt).input_ids) == tok.render_chat(messages)
    moved = serializer.serialize(prompt, order=["b", "a", "c"])
    assert tok.decode(moved.input_ids) == tok.render_chat(
        [messages[0], {"role": "user", "content": user.replace("Cats purr.\n[2] Dogs bark.",
                                                               "Dogs bark.\n[2] Cats purr.")}]
    )  # fmt: skip
    # A segment's own tokens do not depend on its label: the same text at another
    # position reuses the cached ids.
    assert moved.segment_tokens["a"] == serializer.serialize(prompt).segment_tokens["a"]
    with pytest.raises(SerializationError, match="fixed"):
        serializer.serialize(prompt, order=["a", "c", "b"])
    plain = serializer.serialize(prompt, chat=False)
    assert tok.decode(plain.input_ids) == "Answer briefly." + user
    assert serializer.head_tokens("Answer briefly.", True, "Context:\n") == moved.head_tokens


def test_non_chat_without_system_or_suffix(tokenizers: dict[str, Tokenizer]) -> None:
    serializer = Serializer(tokenizers["builtin"])
    out = serializer.serialize(_prompt(None, [("a", "Alpha."), ("b", "Beta.")], ""), chat=False)
    assert out.head_tokens == 0 and out.tail_tokens == 0
    assert out.prefix_key == prefix_key_of([])
    assert [(a.kind, a.segment_id) for a in out.anchors] == [("segment", "a"), ("segment", "b")]
    assert serializer.head_tokens("Sys.", chat=False) == len(tokenizers["builtin"].encode("Sys."))
    with_system = serializer.serialize(_prompt("Sys.", [], "Q?"), chat=False)
    assert with_system.prefix_key != out.prefix_key


@pytest.mark.parametrize(
    ("order", "reorder", "message"),
    [
        (["a", "b"], True, "must be a permutation"),
        (["a", "b", "c", "c"], True, "must be a permutation"),
        (["a", "b", "b"], True, "must be a permutation"),
        (["a", "b", "x"], True, "must be a permutation"),
        (["c", "b", "a"], False, "does not allow reordering"),
    ],
)
def test_order_is_validated(
    tokenizers: dict[str, Tokenizer], order: list[str], reorder: bool, message: str
) -> None:
    prompt = _prompt("s", [("a", "1"), ("b", "2"), ("c", "3")], "q", reorder=reorder)
    serializer = Serializer(tokenizers["builtin"])
    with pytest.raises(SerializationError, match=message):
        serializer.serialize(prompt, order=order)
    assert serializer.serialize(prompt, order=["a", "b", "c"]).order == ("a", "b", "c")


def test_segment_cache_is_an_lru_bounded_in_bytes(tokenizers: dict[str, Tokenizer]) -> None:
    probe = Serializer(tokenizers["builtin"])
    probe.serialize(_prompt(None, [("a", "text a")], ""))
    one = probe.cache_stats()["segments"]["bytes"]  # every entry below has this size
    capacity = 2 * one + one // 2
    serializer = Serializer(tokenizers["builtin"], segment_cache_bytes=capacity)
    for seg_id in ("a", "b", "c"):
        serializer.serialize(_prompt(None, [(seg_id, "text " + seg_id)], ""))
    info = serializer.cache_stats()["segments"]
    assert (info["entries"], info["misses"], info["bytes"]) == (2, 3, 2 * one)
    assert info["capacity_bytes"] == capacity
    serializer.serialize(_prompt(None, [("c", "text c")], ""))  # still cached
    serializer.serialize(_prompt(None, [("a", "text a")], ""))  # evicted: a miss
    info = serializer.cache_stats()["segments"]
    assert (info["hits"], info["misses"]) == (1, 4)
    with pytest.raises(ValueError, match="capacity_bytes"):
        Serializer(tokenizers["builtin"], segment_cache_bytes=0)


@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.sampled_from("abcdefgh"), max_size=6),
            st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(1, 40)), max_size=4),
        ),
        max_size=12,
    ),
    capacity=st.integers(150, 600),
)
def test_many_keys_at_once_are_the_same_as_one_at_a_time(
    steps: list[tuple[list[str], list[tuple[str, int]]]], capacity: int
) -> None:
    """`get_many` and `put_many` (the serializer's one lookup per prompt) keep, evict and
    count exactly as `get` and `put` of the same keys in turn."""

    def size_of(key: str, value: int) -> int:
        return value

    many: ByteLRU[str, int] = ByteLRU(capacity, size_of)
    single: ByteLRU[str, int] = ByteLRU(capacity, size_of)
    for keys, entries in steps:
        assert many.get_many(keys) == [single.get(key) for key in keys]
        many.put_many(entries)
        for key, value in entries:
            single.put(key, value)
        assert many.stats() == single.stats()
        assert list(many._items.items()) == list(single._items.items())


def test_the_caches_count_the_memory_they_really_hold(tokenizers: dict[str, Tokenizer]) -> None:
    """The bytes a cache reports are what tracemalloc sees it keep (within 20 %), so a
    bound in bytes bounds the process's memory: distinct segments and system prompts,
    far more than fit, leave the caches at their capacity."""
    capacity = 2 * 1024 * 1024
    serializer = Serializer(tokenizers["builtin"], capacity, capacity)
    words = [f"w{n:05d}" for n in range(20_000)]
    prompts = [
        _prompt(
            " ".join(words[n * 50 : n * 50 + 400]),  # a distinct ~2.8k-character system prompt
            [(f"doc-{n}-{k}", " ".join(words[n * 7 + k * 900 :][:300])) for k in range(4)],
            "?",
        )
        for n in range(300)
    ]
    serializer.serialize(prompts[0])  # the tokenizer's own first-use allocations
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for prompt in prompts[1:]:
            serializer.serialize(prompt)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = serializer.cache_stats()
    reported = stats["segments"]["bytes"] + stats["heads"]["bytes"]
    assert stats["segments"]["bytes"] <= capacity and stats["heads"]["bytes"] <= capacity
    assert stats["segments"]["bytes"] > capacity * 0.9  # full: entries were evicted
    assert stats["segments"]["entries"] < 4 * len(prompts)
    assert abs(held - reported) <= 0.2 * reported, (held, reported)


def test_unusable_chat_templates(tmp_path: Path) -> None:
    prompt = _prompt("s", [("a", "x")], "q")
    upper = write_bpe_dir(tmp_path / "upper", chat_template="{{ messages[-1]['content'] | upper }}")
    with pytest.raises(SerializationError, match="verbatim"):
        Serializer(load_model_dir(upper)).serialize(prompt)
    bare = write_bpe_dir(tmp_path / "bare", chat_template=None)
    serializer = Serializer(load_model_dir(bare))
    with pytest.raises(ChatTemplateError):
        serializer.serialize(prompt)
    assert serializer.serialize(prompt, chat=False).head_tokens > 0
