"""The ``builtin`` tokenizer: small, deterministic, built locally.

A byte-level BPE (vocab 8192) trained with the ``tokenizers`` library on a corpus that
this module generates from a fixed seed, with ChatML special tokens and a Qwen-like
ChatML chat template. It stands in for a served model's tokenizer in the tests, the demo
and the simulated engine; its granularity is realistic: about 4 characters per token on
English-like generated text, about 3 on English prose.

The result is cached on disk as ``tokenizer.json`` + ``tokenizer_config.json`` (a model
directory, loadable like any other) under ``<cache>/tokenizers/builtin-<version>/``.
Two processes may build it at once: each builds in its own temporary directory and
renames it into place atomically; the loser keeps the winner's copy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from prism_tokens.builtin_corpus import corpus

BUILTIN_VERSION = "3"
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen-style ChatML (as Qwen2.5-Instruct, without its default system message): the
# generation prompt opens the assistant turn. Without tools it renders plain ChatML;
# with `tools` it writes their JSON into the system turn, assistant `tool_calls` as
# `<tool_call>` blocks and `tool` messages as `<tool_response>` blocks in a user turn,
# the format SGLang's `qwen25` tool-call parser reads.
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_CLOSING = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- " + repr(TOOLS_PREAMBLE) + " }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- " + repr(TOOLS_CLOSING) + " + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined"
    " and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant\\n' + message['content'] }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{- call['function']['arguments'] | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_builtin() -> HFTokenizer:
    """Train the builtin byte-level BPE from the generated corpus (a few seconds)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def builtin_config() -> dict[str, object]:
    """The ``tokenizer_config.json`` written next to the builtin ``tokenizer.json``."""
    return {
        "tokenizer_class": "PrismBuiltinTokenizer",
        "builtin_version": BUILTIN_VERSION,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
    }


def write_builtin(directory: Path) -> None:
    """Build the builtin tokenizer into ``directory`` (created, must not hold one yet)."""
    directory.mkdir(parents=True, exist_ok=True)
    train_builtin().save(str(directory / "tokenizer.json"), pretty=False)
    config = json.dumps(builtin_config(), indent=2, sort_keys=True) + "\n"
    (directory / "tokenizer_config.json").write_text(config, encoding="utf-8")


def ensure_builtin(cache_root: Path) -> Path:
    """Return the builtin tokenizer's model directory under ``cache_root``, building it
    first if absent. Safe against concurrent builders (temp dir + atomic rename)."""
    final = cache_root / "tokenizers" / f"builtin-{BUILTIN_VERSION}"
    if (final / "tokenizer_config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".builtin-{BUILTIN_VERSION}-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        write_builtin(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process won the race (final exists, non-empty): use its copy.
            if not (final / "tokenizer_config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
