"""A tiny synthetic Llama GGUF file shaped like SmolLM2's (for test_smollm2_model.py).

Written with `gguf.GGUFWriter` from a seed: 2 layers, hidden 64, 4 heads, 2 KV heads,
head_dim 16, FFN 128, no `output.weight` (tied embeddings), the same tensor types as
`SmolLM2-135M-Instruct.Q4_1.gguf` (Q8_0 embeddings, Q4_1 matrices, F32 norms) plus one
F16 matrix, and a byte-level BPE ("gpt2") vocabulary: 3 control tokens, the 256 byte
symbols and a few merges, with a ChatML chat template. `expected` holds the Hugging Face
weights the conversion must produce: the written values quantized and dequantized by
`gguf.quants`, in HF layout (q/k not permuted), as float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import dequantize, quantize

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 64, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
CONTEXT = 512
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t", "e n", "Ġ w"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_symbols() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    visible += range(ord("®"), ord("ÿ") + 1)
    extra = iter(range(256, 512))
    return [chr(b) if b in visible else chr(next(extra)) for b in range(256)]


def vocabulary() -> list[str]:
    return SPECIALS + byte_symbols() + [merge.replace(" ", "") for merge in MERGES]


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """The q/k row order llama.cpp's convert_hf_to_gguf.py writes (its `permute`)."""
    rows = weights.shape[0]
    return weights.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weights.shape)


@dataclass
class SyntheticGGUF:
    path: Path
    tokens: list[str]
    expected: dict[str, np.ndarray]  # HF name -> float32 values the conversion must give


def write_synthetic_gguf(path: Path, seed: int = 0) -> SyntheticGGUF:
    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    writer = GGUFWriter(path, "llama")
    writer.add_name("synthetic-smollm2-shape")
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_1)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [TokenType.CONTROL] * len(SPECIALS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    )
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    writer.add_quantization_version(2)

    expected: dict[str, np.ndarray] = {}

    def tensor(
        gguf_name: str,
        hf_name: str,
        shape: tuple[int, ...],
        qtype: GGMLQuantizationType,
        heads: int | None = None,
    ) -> None:
        if len(shape) == 1:
            values = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            values = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        stored = quantize(values, qtype)
        # Q4_1/Q8_0/F16 work per row, so quantizing commutes with llama.cpp's row permutation.
        expected[hf_name] = dequantize(stored, qtype).astype(np.float32).reshape(shape)
        if heads is not None:
            stored = llama_cpp_permute(stored, heads)
        writer.add_tensor(gguf_name, stored, raw_dtype=qtype)

    f32, f16 = GGMLQuantizationType.F32, GGMLQuantizationType.F16
    q4_1, q8_0 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0
    kv = KV_HEADS * HEAD_DIM
    tensor("token_embd.weight", "model.embed_tokens.weight", (len(tokens), HIDDEN), q8_0)
    for i in range(LAYERS):
        o_type = f16 if i == LAYERS - 1 else q4_1  # one F16 matrix besides the Q4_1 ones
        layer = [  # GGUF name, HF name, shape, type, heads of llama.cpp's q/k permutation
            ("attn_norm", "input_layernorm", (HIDDEN,), f32, None),
            ("attn_q", "self_attn.q_proj", (HIDDEN, HIDDEN), q4_1, HEADS),
            ("attn_k", "self_attn.k_proj", (kv, HIDDEN), q4_1, KV_HEADS),
            ("attn_v", "self_attn.v_proj", (kv, HIDDEN), q4_1, None),
            ("attn_output", "self_attn.o_proj", (HIDDEN, HIDDEN), o_type, None),
            ("ffn_norm", "post_attention_layernorm", (HIDDEN,), f32, None),
            ("ffn_gate", "mlp.gate_proj", (FFN, HIDDEN), q4_1, None),
            ("ffn_up", "mlp.up_proj", (FFN, HIDDEN), q4_1, None),
            ("ffn_down", "mlp.down_proj", (HIDDEN, FFN), q4_1, None),
        ]
        for gguf_name, hf_name, shape, qtype, heads in layer:
            hf = f"model.layers.{i}.{hf_name}.weight"
            tensor(f"blk.{i}.{gguf_name}.weight", hf, shape, qtype, heads)
    tensor("output_norm.weight", "model.norm.weight", (HIDDEN,), f32)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return SyntheticGGUF(path=path, tokens=tokens, expected=expected)
