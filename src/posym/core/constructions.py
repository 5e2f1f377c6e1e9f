"""The paper's constructions T_Index and T_Retrieval as real attention heads (docs/method.md section 5).

Both heads read one-hot token embeddings plus a constant coordinate (coordinate V, always 1), map
them to ONE RoPE plane (2-d queries and keys) and score key j for the query at n as

    logit(n, j) = beta * (R(n theta) q_n) . (R(j theta) k_j) = beta * q_n^T R((j - n) theta) k_j,

R(a) the 2-d rotation by a. That is exactly what one frequency plane of RoPE does (GPT-J rotates
each query/key pair of coordinates by position * frequency), so position enters ONLY through the
relative rotation R(-(n - j) theta); the weights never see positions. We use |v| = 1 with v = (1, 0),
the normalisation of Theorem 3.2, and float64 throughout.

- T_Index (Selective Index): every key is v (W_K reads only the constant coordinate), so logits
  depend on position only. A symbol's query is v, an integer sigma's query is R(-sigma theta) v:
  logit = cos((n - j - sigma) theta), uniquely maximal at j = n - sigma when theta / pi is
  irrational (a symbol attends to itself). Values copy symbol coordinates times 2, integers give 0,
  residual out = x + a: argmax decoding reads the copied symbol (2 > 1) or keeps the integer.
- T_Retrieval: letters numbered phi = 1..A, omega = 2 pi / A. Key = R(-phi(left letter) omega) v,
  query of a pair (x, y) = R(-phi(y) omega) v (a leaf (x, number) queries its own x):
  logit = cos((phi(left_j) - phi(y)) omega + (n - j) theta). With 0 < theta < omega / (2 n0) the
  match (angle (n - j) theta < omega / 2) beats every other letter (angle > omega / 2) for n <= n0.
  Values are the identity and the output is the attention alone (no residual).

Length n means: the query sits at position n and sees keys 0..n (n + 1 tokens). Layers compose
through argmax decoding: each application maps token ids to token ids (T_Index's residual holds
e_sigma + 2 e_symbol, which only a readout turns back into one token).

Also here: the functions the heads must compute (`selective_index`, `retrieval`), multi-hop
composition on task samples (`multihop`) and the heads' swap scores (`construction_scores`).
Their discrepancy, the inverse temperature they need and the `posym theory` report live in
`posym.core.theory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posym.core.paper import TAU
from posym.core.scores import swap_scores
from posym.core.tasks import TaskConfig
from posym.errors import PosymError


def _rotate(vec: Tensor, angle: Tensor) -> Tensor:
    """R(angle) vec for vec [..., 2] and angle broadcastable to [...]."""
    c, s = torch.cos(angle), torch.sin(angle)
    return torch.stack([c * vec[..., 0] - s * vec[..., 1], s * vec[..., 0] + c * vec[..., 1]], -1)


@dataclass(frozen=True)
class Head:
    """One attention head on one RoPE plane over one-hot embeddings plus a constant coordinate."""

    w_q: Tensor
    """[V + 1, 2] query weights (row V reads the constant coordinate)."""
    w_k: Tensor
    """[V + 1, 2] key weights."""
    w_v: Tensor
    """[V + 1, V + 1] value weights (output coordinates = embedding coordinates)."""
    theta: float
    """RoPE angle of the plane: a token at position p is rotated by p * theta."""
    beta: float
    """Inverse temperature multiplying every logit."""
    residual: bool
    """Whether the layer output is x + attention (T_Index) or the attention alone (T_Retrieval)."""

    @property
    def vocab_size(self) -> int:
        """Token ids 0..V-1 (PAD included); the embedding has V + 1 coordinates."""
        return self.w_q.shape[0] - 1


def index_head(cfg: TaskConfig, theta: float, beta: float = 1.0) -> Head:
    """T_Index for the number-task vocabulary of `cfg` (integers 1..R are offsets, the rest symbols)."""
    if cfg.task != "number":
        raise PosymError("T_Index runs on the number task")
    V, R = cfg.vocab_size, cfg.int_range
    v = torch.tensor([1.0, 0.0], dtype=torch.float64)
    sigma = torch.zeros(V + 1, dtype=torch.float64)
    sigma[1 : R + 1] = torch.arange(1, R + 1, dtype=torch.float64)  # integer id i is offset i
    w_q = _rotate(v, -sigma * theta)  # [V+1, 2]: symbols (sigma = 0) query v
    w_q[0] = w_q[V] = 0.0  # PAD and the constant coordinate add nothing to the query
    w_k = torch.zeros(V + 1, 2, dtype=torch.float64)
    w_k[V] = v  # every token's key is v: the constant coordinate alone writes it
    w_v = torch.zeros(V + 1, V + 1, dtype=torch.float64)
    sym = torch.arange(R + 1, V)
    w_v[sym, sym] = 2.0  # copy symbol coordinates x2 so the copy outvotes the residual integer
    return Head(w_q, w_k, w_v, float(theta), float(beta), residual=True)


def letter_of(cfg: TaskConfig) -> tuple[Tensor, Tensor]:
    """Per letter-task id: (phi of the left letter, phi of the letter it looks up), 1-based; PAD 0."""
    if cfg.task != "letter":
        raise PosymError("T_Retrieval runs on the letter task")
    L, R = cfg.alphabet_size, cfg.int_range
    leaf = torch.arange(L).repeat_interleave(R) + 1  # [L*R] ids 1 + x*R + (n-1)
    first = torch.arange(L).repeat_interleave(L) + 1  # [L*L] ids 1 + L*R + x*L + y
    second = torch.arange(L).repeat(L) + 1
    zero = torch.zeros(1, dtype=torch.long)
    left = torch.cat([zero, leaf, first])  # [V]
    looks_up = torch.cat([zero, leaf, second])  # a leaf looks up its own letter
    return left, looks_up


def retrieval_head(cfg: TaskConfig, theta: float, beta: float = 1.0) -> Head:
    """T_Retrieval for the letter-task vocabulary of `cfg`."""
    left, looks_up = letter_of(cfg)
    V = cfg.vocab_size
    omega = 2 * math.pi / cfg.alphabet_size
    v = torch.tensor([1.0, 0.0], dtype=torch.float64)
    w_q = torch.zeros(V + 1, 2, dtype=torch.float64)
    w_k = torch.zeros(V + 1, 2, dtype=torch.float64)
    w_q[1:V] = _rotate(v, -looks_up[1:].double() * omega)  # [V-1, 2]
    w_k[1:V] = _rotate(v, -left[1:].double() * omega)
    return Head(w_q, w_k, torch.eye(V + 1, dtype=torch.float64), float(theta), float(beta), False)


def attention_logits(head: Head, ids: Tensor, *, last_only: bool = False) -> Tensor:
    """beta * RoPE logits [B, Q, L] of token ids [B, L] (Q = L, or 1 with last_only), causal -inf.

    Embedding lookup stands for the one-hot product: x @ W = W[id] + W[V] (constant coordinate).
    """
    B, L = ids.shape
    V = head.vocab_size
    pos = torch.arange(L, dtype=torch.float64)
    q = _rotate(head.w_q[ids] + head.w_q[V], pos * head.theta)  # [B, L, 2]
    k = _rotate(head.w_k[ids] + head.w_k[V], pos * head.theta)  # [B, L, 2]
    qpos = pos
    if last_only:
        q, qpos = q[:, -1:], pos[-1:]
    logits = head.beta * torch.einsum("bqd,bkd->bqk", q, k)  # [B, Q, L]
    return logits.masked_fill(pos[None, :] > qpos[:, None], float("-inf"))


def forward(
    head: Head, ids: Tensor, *, hard: bool = True, last_only: bool = False, logits: Tensor | None = None
) -> Tensor:
    """Layer output [B, Q, V + 1] on one-hot inputs: hard (argmax) or softmax attention
    (`logits` [B, Q, L]: precomputed `attention_logits`, to reuse them across calls)."""
    if logits is None:
        logits = attention_logits(head, ids, last_only=last_only)  # [B, Q, L]
    if hard:
        attn = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    else:
        attn = torch.softmax(logits, dim=-1)  # [B, Q, L]
    V = head.vocab_size
    B, Q, L = attn.shape
    # attention-weighted one-hot inputs without materialising [B, L, V + 1]: mass per token id
    mass = torch.zeros(B, Q, V + 1, dtype=torch.float64)
    mass.scatter_add_(-1, ids[:, None, :].expand(B, Q, L), attn)  # [B, Q, V+1]
    mass[..., V] = attn.sum(-1)  # the constant coordinate of every key is 1
    out = mass @ head.w_v  # [B, Q, V+1]
    if head.residual:
        x = torch.nn.functional.one_hot(ids[:, L - Q :], V + 1).double()  # [B, Q, V+1]
        x[..., V] = 1.0
        out = out + x
    return out


def apply(
    head: Head, ids: Tensor, *, hard: bool = True, last_only: bool = False, logits: Tensor | None = None
) -> Tensor:
    """One application: the layer followed by argmax decoding over token coordinates -> ids [B, Q]."""
    out = forward(head, ids, hard=hard, last_only=last_only, logits=logits)
    return out[..., : head.vocab_size].argmax(-1)


def compose(head: Head, ids: Tensor, layers: int, *, hard: bool = True) -> list[Tensor]:
    """Token ids after 0, 1, ..., `layers` applications at every position (index = layer count)."""
    out = [ids]
    for _ in range(layers):
        out.append(apply(head, out[-1], hard=hard))
    return out


# ---- the functions the heads must compute ----------------------------------------------------------


def selective_index(cfg: TaskConfig, ids: Tensor) -> Tensor:
    """Selective Index at every position [B, L]: an integer s at p becomes the token at p - s if that
    is a symbol, otherwise it stays; symbols stay; -1 (undefined) where p - s < 0."""
    B, L = ids.shape
    R = cfg.int_range
    pos = torch.arange(L)
    is_int = (ids >= 1) & (ids <= R)
    src = torch.where(is_int, pos - ids, pos)  # [B, L]
    looked = ids.gather(1, src.clamp_min(0))
    out = torch.where(is_int & (looked > R), looked, ids)
    return torch.where(src < 0, torch.full_like(ids, -1), out)


def retrieval(cfg: TaskConfig, ids: Tensor, *, last_only: bool = False) -> Tensor:
    """Retrieval at every position [B, L] (or the last, [B, 1]): the unique token at or before p whose
    left letter is the letter p looks up (a leaf: itself); -1 where there is no unique match."""
    left, looks_up = letter_of(cfg)
    B, L = ids.shape
    qpos = torch.arange(L - 1 if last_only else 0, L)  # [Q]
    q_ids = ids[:, qpos]  # [B, Q]
    want = looks_up[q_ids]
    causal = torch.arange(L)[None, :] <= qpos[:, None]  # [Q, L]
    match = (left[ids][:, None, :] == want[:, :, None]) & causal  # [B, Q, L]
    leaf = want == left[q_ids]  # a leaf matches itself first: Reflexive
    found = ids.gather(1, match.double().argmax(-1))  # the (first) match
    unique = match.sum(-1) == 1
    return torch.where(leaf, q_ids, torch.where(unique, found, torch.full_like(q_ids, -1)))


# ---- multi-hop composition and head scores on task samples ---------------------------------------------


def with_beta(head: Head, beta: float) -> Head:
    """The same head at inverse temperature `beta`."""
    return Head(head.w_q, head.w_k, head.w_v, head.theta, float(beta), head.residual)


def multihop(
    head: Head, cfg: TaskConfig, ids: Tensor, answer: Tensor, hops: Tensor, *, hard: bool = True
) -> dict[str, float]:
    """Compose the head max_hops times over whole task sequences (Reflexive^(L-h) o F^h: once the query
    holds the answer, further applications keep it). Fractions of samples whose query holds the
    answer after exactly h applications, after all max_hops, and already after h - 1 (should be 0)."""
    states = torch.stack(compose(head, ids, cfg.max_hops, hard=hard))[:, :, -1]  # [H+1, B] query ids
    rows = torch.arange(len(ids))
    frac = lambda hit: hit.double().mean().item()  # noqa: E731
    return {
        "after_h": frac(states[hops, rows] == answer),
        "after_all": frac(states[-1] == answer),
        "after_h_minus_1": frac(states[hops - 1, rows] == answer),
    }


def swap_logits(head: Head, ids: Tensor) -> tuple[Tensor, Tensor]:
    """The last token's logits over keys 0..n, clean [B, n+1], and swapped [B, n+1, n+1] with
    swapped[:, a, b] = beta * (R(n theta) q_n) . (R(a theta) k(content of b)): key a holding b's token."""
    B, L = ids.shape
    V = head.vocab_size
    pos = torch.arange(L, dtype=torch.float64)
    q = _rotate(head.w_q[ids[:, -1]] + head.w_q[V], pos[-1] * head.theta)  # [B, 2]
    k = head.w_k[ids] + head.w_k[V]  # [B, L(b), 2] unrotated keys
    k_at = _rotate(k[:, None, :, :], pos[None, :, None] * head.theta)  # [B, L(a), L(b), 2]
    swapped = head.beta * torch.einsum("bd,bakd->bak", q, k_at)  # [B, L, L]
    return swapped.diagonal(dim1=1, dim2=2), swapped


def construction_scores(head: Head, ids: Tensor, *, tau: float = TAU) -> dict[str, float]:
    """Mean positional / symbolic swap scores of the last token (docs/method.md section 3; `scores.swap_scores`)."""
    clean, swapped = swap_logits(head, ids)
    out = swap_scores(clean, swapped, tau=tau)
    return {"s_pos": out["s_pos"].mean().item(), "s_sym": out["s_sym"].mean().item()}
