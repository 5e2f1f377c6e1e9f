"""The GPT-J model posym trains and analyses: its config and its construction.

A posym model is a plain Hugging Face `GPTJForCausalLM` (the paper's authors used the same class),
so every checkpoint directory loads with `GPTJForCausalLM.from_pretrained` and nothing here is
needed to read it back. What posym adds next to the weights of a checkpoint (`posym.json` with
the model config, which carries the RoPE variant) is read by `posym.models`.
"""

from __future__ import annotations

from dataclasses import dataclass

from posym.core.rope import apply_variant, check_variant
from posym.errors import PosymError


DROPOUTS = ("dropout", "embd_dropout", "resid_dropout", "attn_dropout")
"""ModelConfig's dropout fields: the shared value and the three per-site overrides."""


@dataclass
class ModelConfig:
    """Shape of a GPT-J decoder (the paper: 12 layers x 1 head, width 128, rotary on all dims)."""

    n_layer: int = 12
    """Number of transformer blocks (layers)."""
    n_head: int = 1
    """Attention heads per layer; the paper uses one so that each layer is one analysable head."""
    n_embd: int = 128
    """Width of the residual stream; each head has n_embd / n_head dimensions."""
    rotary_dim: int | None = None
    """Head dimensions that RoPE rotates (even, <= head dim); None rotates all of them, as the paper."""
    rope_base: float = 10000.0
    """RoPE base (frequencies base^(-2(k-1)/rotary_dim)); GPT-J hard-codes 10,000, so another base is a
    posym variant (posym.core.rope) that plain transformers loading ignores."""
    rope_bands: list[list[int]] | None = None
    """RoPE variant: inclusive [first, last] frequency IDs (1 = fastest) that rotate, one band for every
    layer or one per layer; other planes get no rotation. None rotates every plane (see posym.core.rope)."""
    nope_from: int | None = None
    """RoPE variant: layers with index >= nope_from get no rotation at all (NoPE); None = RoPE everywhere."""
    n_positions: int = 8192
    """Longest sequence the rotary table covers; RoPE has no learned positions, so this is free and
    only bounds length-generalization experiments (the paper goes to ~5,000 tokens)."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of n_embd."""
    activation: str = "gelu_new"
    """MLP activation (a `transformers.activations` name); GPT-J's default is the tanh GELU `gelu_new`."""
    dropout: float = 0.1
    """Dropout on embeddings, attention probabilities and residual branches (training only), wherever
    the three fields below are None."""
    embd_dropout: float | None = None
    """Dropout on the token embeddings (GPT-J's `embd_pdrop`); None = `dropout`. The authors' released
    code passed it under a misspelt keyword, so their effective value was 0.0 (docs/method.md section 6)."""
    resid_dropout: float | None = None
    """Dropout on the attention output and the MLP output before each residual add (`resid_pdrop`);
    None = `dropout`."""
    attn_dropout: float | None = None
    """Dropout on the attention probabilities (`attn_pdrop`); None = `dropout`."""
    layer_norm_epsilon: float = 1e-5
    """LayerNorm epsilon."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of linear and embedding weights."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "n_positions", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise PosymError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise PosymError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        rot = self.resolved_rotary_dim
        if rot < 2 or rot % 2 or rot > self.head_dim:
            raise PosymError(
                f"model.rotary_dim must be an even number between 2 and the head dimension {self.head_dim}, got {rot}"
            )
        check_variant(self)
        for name in DROPOUTS:
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise PosymError(f"model.{name} must be in [0, 1), got {value}")
        if not self.layer_norm_epsilon > 0:
            raise PosymError(f"model.layer_norm_epsilon must be positive, got {self.layer_norm_epsilon}")
        if not self.initializer_range >= 0:
            raise PosymError(
                f"model.initializer_range (the std of the initial weights) must be >= 0, got {self.initializer_range}"
            )
        from transformers.activations import ACT2FN

        if self.activation not in ACT2FN:
            raise PosymError(f"model.activation {self.activation!r} is not a transformers activation name")

    def resolved_dropout(self, name: str) -> float:
        """The dropout probability of one site (`embd_dropout`, `resid_dropout` or `attn_dropout`).

        >>> ModelConfig(embd_dropout=0.0).resolved_dropout("embd_dropout"), ModelConfig().resolved_dropout("attn_dropout")
        (0.0, 0.1)
        """
        value = getattr(self, name)
        return self.dropout if value is None else value

    @property
    def head_dim(self) -> int:
        """Dimensions per head."""
        return self.n_embd // self.n_head

    @property
    def resolved_rotary_dim(self) -> int:
        """Rotated dimensions per head (rotary_dim, or the whole head when it is None)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


def gptj_config(config: ModelConfig, vocab_size: int):
    """The `transformers.GPTJConfig` of a posym model with `vocab_size` tokens (PAD = id 0)."""
    from transformers import GPTJConfig

    if vocab_size < 2:
        raise PosymError(f"vocab_size must be at least 2, got {vocab_size}")
    return GPTJConfig(
        vocab_size=vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        # Always explicit: GPT-J's "None" path rotates n_embd dims and breaks with several heads.
        rotary_dim=config.resolved_rotary_dim,
        n_inner=config.mlp_ratio * config.n_embd,
        activation_function=config.activation,
        resid_pdrop=config.resolved_dropout("resid_dropout"),
        embd_pdrop=config.resolved_dropout("embd_dropout"),
        attn_pdrop=config.resolved_dropout("attn_dropout"),
        layer_norm_epsilon=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def build_model(config: ModelConfig, vocab_size: int, seed: int, *, attn_implementation: str = "sdpa"):
    """A freshly initialised `GPTJForCausalLM` (float32, train mode); same seed, same weights.

    The global torch RNG is left untouched (initialisation runs in a forked RNG), so building a
    model never changes the dropout stream of a training run.
    """
    import torch
    from transformers import GPTJForCausalLM

    hf_config = gptj_config(config, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTJForCausalLM(hf_config)
    try:
        model.set_attn_implementation(attn_implementation)
    except ValueError:  # transformers < 5.2x has no SDPA path for GPT-J: keep eager (same maths)
        model.set_attn_implementation("eager")
    apply_variant(model, config)
    return model.train()


DEVICES = ("auto", "cpu", "cuda")
"""The devices a command runs on (auto: cuda when available)."""


def resolve_device(device: str) -> str:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a PosymError."""
    import torch

    if device not in DEVICES:
        raise PosymError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PosymError("--device cuda was asked for but torch sees no CUDA GPU")
    return device
