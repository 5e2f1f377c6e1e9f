"""Tiny random Hugging Face RoPE models of every architecture the scores engine supports, with
queries and keys scaled up so attention is peaked (importable from any test in tests/):
    from tiny_models import KINDS, VOCAB, tiny_model, random_prompts
"""

from __future__ import annotations

import torch
import transformers

KINDS = ["gptj", "gpt_neox", "llama", "mistral", "qwen2"]
"""GPT-J (interleaved planes, partial rotary), NeoX (half-split, partial rotary, qkv bias), Llama (GQA,
YaRN-scaled tables), Mistral and Qwen2 (GQA)."""
VOCAB = 40


def tiny_model(kind: str, dtype=torch.float64, seed: int = 0, qk_scale: float = 8.0):
    """A random 2-layer model of `kind` (eager attention) with query/key weights multiplied by
    `qk_scale` so that attention is peaked."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, max_position_embeddings=64, attn_implementation="eager")
    llama_like = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, **common)
    config = {
        "gptj": lambda: transformers.GPTJConfig(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                                rotary_dim=8, attn_implementation="eager"),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                       intermediate_size=64, rotary_pct=0.5, attention_bias=True,
                                                       **common),
        # YaRN scales the rotary tables (attention_scaling != 1): R is not orthogonal there
        "llama": lambda: transformers.LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                                "original_max_position_embeddings": 32},
                                                  **llama_like),
        "mistral": lambda: transformers.MistralConfig(sliding_window=None, **llama_like),
        "qwen2": lambda: transformers.Qwen2Config(**llama_like),
    }[kind]()
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in ("q_proj", "k_proj", "query_key_value")):
                param.mul_(qk_scale)
    return model


def random_prompts(lengths, seed=0):
    """Random ids in 1..VOCAB-1, one list per length."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]
