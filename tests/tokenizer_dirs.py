"""Model directories written by the tests: small tokenizers trained on the spot, saved
as ``tokenizer.json`` + ``tokenizer_config.json`` like a Hugging Face model directory."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

TRAIN_TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "retrieved documents share a prefix when they come first in the prompt",
    "a radix tree keeps the key value cache of recent requests on the gpu",
    "hello world, this is a test of the tokenizer; numbers 12345 and symbols !?",
] * 20

# Llama-3-like: a BOS token written by the template, headers per role, a role check
# through raise_exception, and the tojson filter.
LLAMA_LIKE_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role'] | tojson) }}"
    "{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# For the WordPiece tokenizer: plain words around the roles (whitespace is dropped).
PLAIN_TEMPLATE = (
    "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


def write_bpe_dir(directory: Path, **config_overrides: object) -> Path:
    """A byte-level BPE (vocab 400) with Llama-like special tokens and chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=LLAMA_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    config: dict[str, object] = {
        "bos_token": {"content": "<|begin_of_text|>", "special": True},
        "eos_token": "<|eot_id|>",
        "chat_template": LLAMA_LIKE_TEMPLATE,
    }
    config.update(config_overrides)
    return _save(directory, tok, config)


def write_wordpiece_dir(directory: Path) -> Path:
    """A lower-casing WordPiece over whitespace/punctuation pre-tokenization."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[UNK]", "[SEP]"], show_progress=False
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer=trainer)
    return _save(directory, tok, {"eos_token": "[SEP]", "chat_template": PLAIN_TEMPLATE})


def _save(directory: Path, tok: Tokenizer, config: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory
