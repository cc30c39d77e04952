"""The tiny model an unmodified SGLang serves on this CPU (docs/sglang-cpu.md).

A Qwen2-family model with seeded random weights (hidden 64, 2 layers, 4 heads, 2 KV
heads, head_dim 16, bf16; ~1.5 MB of safetensors) and the proxy's builtin tokenizer
(byte-level BPE, vocab 8192, ChatML template) as a normal model directory:
`config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json`. SGLang loads it with transformers; the proxy and prism-sim load
the same `tokenizer.json` from it (`--tokenizer <dir>`), so all three tokenize alike.

Deterministic from the seed (same bytes on every build) and cached under
`<cache>/models/tiny-qwen2-<version>-seed<seed>/`; no hub is ever asked. It answers
with random tokens: use it for behaviour (reuse, eviction, aborts, API shapes), never
for timings or answer quality.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from prism_tokens.builtin import CHATML_TEMPLATE, VOCAB_SIZE, ensure_builtin
from prism_tokens.tokenizer import default_cache_dir

MODEL_VERSION = "2"


def tiny_config(eos_token_id: int, pad_token_id: int) -> dict[str, object]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }


def write_tiny_model(directory: Path, seed: int) -> None:
    """Build the model directory into `directory` (needs torch and transformers)."""
    from sglang_cpu.torchvision_shim import register

    register()  # transformers' model modules import torchvision
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer_dir = ensure_builtin(default_cache_dir())
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["added_tokens"]
    ids = {token["content"]: token["id"] for token in vocab}
    config = Qwen2Config(**tiny_config(ids["<|im_end|>"], ids["<|endoftext|>"]))
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    shutil.copyfile(tokenizer_dir / "tokenizer.json", directory / "tokenizer.json")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 8192,
        "chat_template": CHATML_TEMPLATE,
    }
    text = json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n"
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")


def build_cached(final: Path, build: Callable[[Path], None]) -> Path:
    """`final` (a model directory), made by `build(tmp)` first if it holds no
    `model.safetensors`: into a temp dir beside it, then an atomic rename, so concurrent
    builders are safe (the loser finds the winner's directory)."""
    if (final / "model.safetensors").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_tiny_model(seed: int = 0, cache_root: Path | None = None) -> Path:
    """The tiny model's directory, built first if absent (`build_cached`)."""
    root = (cache_root or default_cache_dir()) / "models"
    final = root / f"tiny-qwen2-{MODEL_VERSION}-seed{seed}"
    return build_cached(final, lambda tmp: write_tiny_model(tmp, seed))
