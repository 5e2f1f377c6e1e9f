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
FAMILIES = [
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "stablelm",
    "starcoder2",
    "granite",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "cohere",
    "phi",
]
"""The other RoPE families posym scores (tests/test_families.py): q/k norms (Qwen3, OLMo 2 over the whole
projection, Gemma 3, Cohere), soft-capping and query pre-scaling (Gemma 2), local/global RoPE bases
(Gemma 3), fused qkv + partial rotary (Phi-3), partial rotary split outside the rotary function
(StableLM, Phi), interleaved planes (Cohere), attention multiplier (Granite), mixtures of experts."""
VOCAB = 40


WINDOWED = ["mistral", "qwen2", "starcoder2", "gemma2", "gemma3_text"]
"""Families whose layers can have a sliding window (`tiny_model(kind, window=w)`): every layer of
Mistral, Starcoder2 and Qwen2 (use_sliding_window, max_window_layers=0), layer 0 of Gemma 2 and
Gemma 3 (sliding, then full attention)."""


def tiny_model(
    kind: str, dtype=torch.float64, seed: int = 0, qk_scale: float = 8.0, window: int | None = None, positions: int = 64
):
    """A random 2-layer model of `kind` (eager attention) with query/key weights multiplied by
    `qk_scale` so that attention is peaked; `window`: the sliding window of its local layers
    (WINDOWED families; default: Gemma 2/3 a window of 32 past every test prompt, the others none);
    `positions`: its max_position_embeddings (n_positions of GPT-J), the longest prompt it takes. The
    weights and rotary tables do not depend on it (no family here scales them by it except Llama's YaRN,
    whose original length is set apart), so a longer one gives the same numbers on shorter prompts."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, max_position_embeddings=positions, attn_implementation="eager")
    llama_like = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **common,
    )
    moe = dict(experts_implementation="eager", **llama_like)  # the grouped-mm experts kernel has no float64
    config = {
        "gptj": lambda: transformers.GPTJConfig(
            vocab_size=VOCAB,
            n_positions=positions,
            n_embd=32,
            n_layer=2,
            n_head=2,
            rotary_dim=8,
            attn_implementation="eager",
        ),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            rotary_pct=0.5,
            attention_bias=True,
            **common,
        ),
        # YaRN scales the rotary tables (attention_scaling != 1): R is not orthogonal there
        "llama": lambda: transformers.LlamaConfig(
            rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}, **llama_like
        ),
        "mistral": lambda: transformers.MistralConfig(sliding_window=None, **llama_like),
        "qwen2": lambda: transformers.Qwen2Config(**llama_like),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=8, **llama_like),
        "gemma": lambda: transformers.GemmaConfig(head_dim=8, **llama_like),
        "gemma2": lambda: transformers.Gemma2Config(
            head_dim=8, query_pre_attn_scalar=24, attn_logit_softcapping=6.0, sliding_window=32, **llama_like
        ),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            **llama_like,
        ),
        "phi3": lambda: transformers.Phi3Config(partial_rotary_factor=0.5, pad_token_id=0, **llama_like),
        "olmo2": lambda: transformers.Olmo2Config(**llama_like),
        "stablelm": lambda: transformers.StableLmConfig(
            partial_rotary_factor=0.5, qk_layernorm=True, use_qkv_bias=True, **llama_like
        ),
        "starcoder2": lambda: transformers.Starcoder2Config(sliding_window=None, **llama_like),
        "granite": lambda: transformers.GraniteConfig(attention_multiplier=0.2, **llama_like),
        "mixtral": lambda: transformers.MixtralConfig(
            num_local_experts=2, num_experts_per_tok=1, sliding_window=None, **moe
        ),
        "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
            num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16, **moe
        ),
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
            head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, **moe
        ),
        "cohere": lambda: transformers.CohereConfig(use_qk_norm=True, **llama_like),
        "phi": lambda: transformers.PhiConfig(
            partial_rotary_factor=0.5,
            qk_layernorm=True,
            **{k: v for k, v in llama_like.items() if k != "num_key_value_heads"},
        ),
    }[kind]()
    if window is not None:
        if kind not in WINDOWED:
            raise ValueError(f"{kind} has no sliding window")
        config.sliding_window = window
        if kind == "qwen2":
            config.use_sliding_window, config.max_window_layers = True, 0
            config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in ("q_proj", "k_proj", "query_key_value", "qkv_proj")):
                param.mul_(qk_scale)
            elif any(part in name for part in ("q_norm", "k_norm", "q_layernorm", "k_layernorm")):
                # a norm after the projection undoes its scale: scale (and vary) the norm's gain instead;
                # RMS-normed q and k have entries ~1, so a gain of ~sqrt(qk_scale) peaks as much
                param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * qk_scale**0.5)
    return model


def random_prompts(lengths, seed=0):
    """Random ids in 1..VOCAB-1, one list per length."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]
