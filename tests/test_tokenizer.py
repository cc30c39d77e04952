"""Tokenizer loading: the builtin tokenizer's determinism, caching and
granularity; model directories with chat templates rendered the Hugging Face way."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_dirs import write_bpe_dir, write_wordpiece_dir

from prism_tokens import builtin as builtin_tokenizer
from prism_tokens.builtin_corpus import CORPUS_SEED, corpus
from prism_tokens.tokenizer import ChatTemplateError, Tokenizer, load_model_dir, load_tokenizer

FIXED_TEXT = "PRISM keeps the hot documents resident; QAS releases 1,024 requests in waves."

_BUILD = """
import json, sys
from pathlib import Path
from prism_tokens.tokenizer import load_tokenizer
tok = load_tokenizer("builtin", cache_dir=Path(sys.argv[1]))
print(json.dumps(tok.encode(sys.argv[2])))
"""


def _build_in_subprocess(cache_root: Path, hash_seed: str) -> subprocess.Popen[str]:
    env = {"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [sys.executable, "-c", _BUILD, str(cache_root), FIXED_TEXT],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def builtin() -> Tokenizer:
    return load_tokenizer("builtin")


@dataclass(frozen=True)
class FreshBuilds:
    shared: Path
    alone: Path
    ids: list[list[int]]


@pytest.fixture(scope="module")
def fresh_builds(tmp_path_factory: pytest.TempPathFactory) -> FreshBuilds:
    # Two processes race to build into one cache root, a third builds alone elsewhere,
    # each with its own hash seed (and so its own Rust HashMap seeds).
    root = tmp_path_factory.mktemp("builds")
    shared, alone = root / "shared", root / "alone"
    procs = [
        _build_in_subprocess(shared, "1"),
        _build_in_subprocess(shared, "2"),
        _build_in_subprocess(alone, "3"),
    ]
    outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0]
    return FreshBuilds(shared, alone, [json.loads(out) for out in outputs])


def test_fresh_builds_are_byte_identical_and_concurrent_builds_are_safe(
    fresh_builds: FreshBuilds,
) -> None:
    ids = fresh_builds.ids
    assert ids[0] == ids[1] == ids[2]
    assert len(ids[0]) > 5
    name = f"builtin-{builtin_tokenizer.BUILTIN_VERSION}"
    for file in ("tokenizer.json", "tokenizer_config.json"):
        a = (fresh_builds.shared / "tokenizers" / name / file).read_bytes()
        assert a == (fresh_builds.alone / "tokenizers" / name / file).read_bytes()
    # The losing builder cleaned up its temporary directory.
    assert sorted(p.name for p in (fresh_builds.shared / "tokenizers").iterdir()) == [name]


def test_cached_builtin_is_loaded_not_rebuilt(
    fresh_builds: FreshBuilds, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Rebuilt(Exception):
        pass

    def no_rebuild(directory: Path) -> None:
        raise Rebuilt(directory)

    monkeypatch.setattr(builtin_tokenizer, "write_builtin", no_rebuild)
    again = load_tokenizer(None, cache_dir=fresh_builds.alone)
    assert again.encode(FIXED_TEXT) == fresh_builds.ids[2]
    monkeypatch.setenv("PRISM_CACHE_DIR", str(fresh_builds.shared))
    assert load_tokenizer().encode(FIXED_TEXT) == fresh_builds.ids[0]
    # A cache root without the tokenizer would need a build: proves the patch bites.
    with pytest.raises(Rebuilt):
        load_tokenizer("builtin", cache_dir=fresh_builds.alone / "elsewhere")


def test_unwritable_default_cache_falls_back_to_temp_dir(
    fresh_builds: FreshBuilds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PRISM_CACHE_DIR", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    fallback = tmp_path / "tmp" / f"prism-{os.getuid()}"
    shutil.copytree(fresh_builds.alone, fallback)
    assert load_tokenizer().encode(FIXED_TEXT) == fresh_builds.ids[2]
    with pytest.raises(OSError):  # an explicit cache_dir is never replaced
        load_tokenizer("builtin", cache_dir=blocker)


def test_builtin_shape(builtin: Tokenizer) -> None:
    assert builtin.name == "builtin"
    assert 7000 <= builtin.vocab_size <= 9000
    assert builtin.eos_token_id == builtin.token_to_id("<|im_end|>")
    for special in builtin_tokenizer.SPECIAL_TOKENS:
        special_id = builtin.token_to_id(special)
        assert special_id is not None
        assert builtin.encode(f"a{special}b")[1] == special_id
    assert builtin.encode("") == []


def test_builtin_granularity_is_realistic(builtin: Tokenizer) -> None:
    # Held-out generated text (another seed than the training corpus) and plain prose:
    # a real 8k-vocab BPE gives ~3-5 characters per token on English.
    held_out = "".join(itertools.islice(corpus(seed=CORPUS_SEED + 1), 300))
    prose = (
        "The city council met on Tuesday evening to discuss the new budget for public "
        "schools. Several parents asked why the plan would reduce the number of teachers "
        "while the cost of buildings continued to increase."
    )
    for text in (held_out, prose):
        chars_per_token = len(text) / len(builtin.encode(text))
        assert 3.0 <= chars_per_token <= 5.0, chars_per_token


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_builtin_round_trips_any_text(builtin: Tokenizer, text: str) -> None:
    assert builtin.decode(builtin.encode(text)) == text


_CHAT_PIECES = st.sampled_from(["<|im_start|>", "<|im_end|>", "user\n", " ", "\n\n", "é漢🙂"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), _CHAT_PIECES), max_size=12))
def test_encode_gives_the_libraries_plain_encode_ids(builtin: Tokenizer, pieces: list[str]) -> None:
    # `encode` goes through `encode_batch_fast` (no offsets); the ids must not change,
    # special tokens written in the text included.
    text = "".join(pieces)
    plain = builtin._backend.encode(text, add_special_tokens=False).ids
    assert builtin.encode(text) == plain


def test_builtin_chat_template_is_chatml(builtin: Tokenizer) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert builtin.render_chat(messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert builtin.render_chat(messages, add_generation_prompt=False).endswith("U<|im_end|>\n")


def test_model_dir_with_chat_template(tmp_path: Path) -> None:
    tok = load_tokenizer(str(write_bpe_dir(tmp_path / "model")))
    assert tok.name == str(tmp_path / "model")
    assert tok.bos_token == "<|begin_of_text|>"  # AddedToken dict form in the config
    assert tok.eos_token_id == tok.token_to_id("<|eot_id|>")
    rendered = tok.render_chat(
        [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "hi"}]
    )
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.encode(rendered)
    assert ids[0] == tok.token_to_id("<|begin_of_text|>")
    assert tok.decode(ids) == rendered
    with pytest.raises(ChatTemplateError, match='unknown role "tool"'):
        tok.render_chat([{"role": "tool", "content": "x"}])


def test_model_dir_template_variants(tmp_path: Path) -> None:
    # A list of named templates: the "default" one is used.
    named = [{"name": "rag", "template": "RAG"}, {"name": "default", "template": "{{ eos_token }}"}]
    tok = load_model_dir(write_bpe_dir(tmp_path / "named", chat_template=named))
    assert tok.render_chat([]) == "<|eot_id|>"
    # No template in the config, but a chat_template.jinja file next to it.
    plain = write_bpe_dir(tmp_path / "jinja", chat_template=None)
    (plain / "chat_template.jinja").write_text("{{ messages | length }}", encoding="utf-8")
    assert load_model_dir(plain).render_chat([{"role": "user", "content": "x"}]) == "1"
    # No template at all.
    (plain / "chat_template.jinja").unlink()
    bare = load_model_dir(plain)
    assert bare.chat_template is None
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        bare.render_chat([{"role": "user", "content": "x"}])


def test_template_sandbox_blocks_unsafe_access(tmp_path: Path) -> None:
    evil = "{{ messages.__class__.__mro__ }}"
    tok = load_model_dir(write_bpe_dir(tmp_path / "evil", chat_template=evil))
    with pytest.raises(ChatTemplateError):
        tok.render_chat([])


def test_wordpiece_model_dir(tmp_path: Path) -> None:
    tok = load_model_dir(write_wordpiece_dir(tmp_path / "wp"))
    ids = tok.encode("The quick brown fox")
    assert tok.decode(ids) == "the quick brown fox"
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "[user] x [assistant] "


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        load_tokenizer(str(tmp_path))


def test_served_vocabulary_is_no_larger_than_the_models_embedding(tmp_path: Path) -> None:
    """A model directory's config.json bounds the ids the proxy lets through: a model
    whose embedding has fewer rows than its tokenizer's vocabulary must not be sent ids
    beyond them (an id outside kills the engine)."""
    directory = write_bpe_dir(tmp_path / "m")
    whole = load_model_dir(directory).vocab_size
    (directory / "config.json").write_text(json.dumps({"vocab_size": whole - 7}))
    assert load_model_dir(directory).vocab_size == whole - 7
    (directory / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 10**6}}))
    assert load_model_dir(directory).vocab_size == whole  # larger: the tokenizer's bound
    (directory / "config.json").write_text("not json")
    assert load_model_dir(directory).vocab_size == whole
