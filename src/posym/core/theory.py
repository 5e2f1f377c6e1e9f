"""Discrepancy, inverse temperature and exactness of the constructions (docs/method.md section 5).

The heads themselves (T_Index, T_Retrieval, the functions they compute, composition, swap scores)
are in `posym.core.constructions`; this module measures them. Length n means: the query sits at
position n and sees keys 0..n (n + 1 tokens).

Discrepancy (Definition 3.1): per input, the gap between the largest and the second-largest logit
at the query. We call Delta(n) the MINIMUM gap over inputs of length n (the worst-case margin): it is
the quantity Lemma F.1's inverse temperature needs (beta >= log((K - 1)(1 - eps) / eps) / Delta with
K keys puts >= 1 - eps on the argmax of every input) and the one Theorem 3.2's bounds hold for.
(Definition 3.1's wording is "max over inputs"; with the max, T_Index at theta = 0.866 breaks the 2 pi^2 / n^2 bound
at 33 of the lengths 2..100, and T_Retrieval's gap can approach 2. `gap_stats` reports the max,
mean and quantiles too.)

- inputs of one length: every (query token, pointed-to token) for T_Index, every valid letter
  assignment (or a sample) for T_Retrieval, and the hardest inputs, which decide correctness and
  the needed beta exactly (`hardest_inputs`, `needed_beta`);
- `check_length`: hard-attention exactness, gaps and the softmax at a given beta on one length;
- Theorem 3.2's bounds (`index_bound`, `retrieval_bound`) and measured curves (`discrepancy_curve`);
- `verify(TheoryConfig(...))` and `summarize_lengths`: every check of `posym theory` (whose tables,
  JSON and Fig. 5A are written by `posym.commands.theory`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posym.core.constructions import (
    Head,
    apply,
    attention_logits,
    index_head,
    letter_of,
    retrieval,
    retrieval_head,
    selective_index,
)
from posym.core.tasks import TaskConfig
from posym.errors import PosymError


def frequency_angle(freq_id: int, *, base: float = 10_000.0, rotary_dim: int = 128) -> float:
    """RoPE angle of frequency ID k (1 = fastest): g_k = base^(-2(k - 1) / rotary_dim)."""
    if not 1 <= freq_id <= rotary_dim // 2:
        raise PosymError(f"frequency ID must be in 1..{rotary_dim // 2}, got {freq_id}")
    return base ** (-2.0 * (freq_id - 1) / rotary_dim)


# ---- discrepancy and inverse temperature (pure, for any head's logits) ------------------------------


def logit_gaps(logits: Tensor) -> Tensor:
    """Largest minus second-largest logit per input: logits [..., keys] (-inf = masked) -> [...]."""
    top = logits.topk(2, dim=-1).values  # [..., 2]
    if not torch.isfinite(top).all():
        raise PosymError("every input needs at least two visible keys to have a discrepancy")
    return top[..., 0] - top[..., 1]


def gap_stats(gaps: Tensor) -> dict[str, float]:
    """Delta (the minimum gap, see the module docstring), max, mean and quantiles of per-input gaps."""
    g = gaps.reshape(-1).double()
    q = torch.quantile(g[:1_000_000], torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    return {
        "delta": g.min().item(),
        "gap_max": g.max().item(),
        "gap_mean": g.mean().item(),
        "gap_q05": q[0].item(),
        "gap_q50": q[1].item(),
        "gap_q95": q[2].item(),
        "inputs": g.numel(),
    }


def lemma_beta(gap: Tensor | float, keys: int, eps: float) -> Tensor:
    """Lemma F.1's sufficient inverse temperature log((keys - 1)(1 - eps) / eps) / gap."""
    return math.log((keys - 1) * (1 - eps) / eps) / torch.as_tensor(gap, dtype=torch.float64)


def min_beta(logits: Tensor, target: Tensor, eps: float, *, steps: int = 80) -> Tensor:
    """Smallest beta >= 0 with softmax(beta * logits)[target] >= 1 - eps, per input [N] (inf when
    the target is not the unique argmax). logits [N, keys] at beta = 1, target [N] key indices.

    The target's mass 1 / (1 + sum_j exp(-beta (l_t - l_j))) grows with beta, so bisection between
    the necessary log((1 - eps) / eps) / margin and Lemma F.1's sufficient bound is exact.
    """
    if not 0 < eps < 1:
        raise PosymError(f"eps must be in (0, 1), got {eps}")
    l_t = logits.gather(1, target[:, None])  # [N, 1]
    others = logits.scatter(1, target[:, None], float("-inf"))  # [N, keys]
    margin = (l_t[:, 0] - others.max(1).values).clamp_min(0.0)  # [N]
    keys = torch.isfinite(logits).sum(1)  # [N]
    ok = margin > 0
    a = (math.log((1 - eps) / eps) / margin[ok]).clamp_min(0.0)  # [M] necessary
    b = (torch.log((keys[ok] - 1) * (1 - eps) / eps) / margin[ok]).clamp_min(0.0)  # [M] sufficient
    d = others[ok] - l_t[ok]  # [M, keys] <= -margin
    for _ in range(steps):
        mid = (a + b) / 2
        good = torch.logsumexp(mid[:, None] * d, 1) <= math.log(eps / (1 - eps))
        a, b = torch.where(good, a, mid), torch.where(good, mid, b)
    out = torch.full_like(margin, math.inf)
    out[ok] = b
    return out


# ---- inputs of one length n (query at n, keys 0..n) --------------------------------------------------


def index_inputs(cfg: TaskConfig, n: int, seed: int = 0) -> Tensor:
    """Every valid query token of length n (integers 1..min(n, R), every symbol) times every content
    of the position it points to; other positions random symbols. ids [N, n + 1]."""
    V, R = cfg.vocab_size, cfg.int_range
    gen = torch.Generator().manual_seed(seed)
    sig = torch.arange(1, min(n, R) + 1).repeat_interleave(V - 1)  # [N_int]
    content = torch.arange(1, V).repeat(min(n, R))
    symbols = torch.arange(R + 1, V)
    N = len(sig) + len(symbols)
    ids = torch.randint(R + 1, V, (N, n + 1), generator=gen)  # [N, n+1] symbol fillers
    rows = torch.arange(len(sig))
    ids[rows, n - sig] = content
    ids[rows, n] = sig
    ids[len(sig) :, n] = symbols
    return ids


def _letter_tokens(cfg: TaskConfig, letters: Tensor, y: Tensor, gen: torch.Generator) -> Tensor:
    """Letter-task ids [N, n + 1] whose left letters are `letters` (0-based) and whose query looks up
    y: keys are random leaves or pointer pairs; the query is a leaf when its own letter is y."""
    L, R = cfg.alphabet_size, cfg.int_range
    leaf = 1 + letters * R + torch.randint(0, R, letters.shape, generator=gen)
    pair = 1 + L * R + letters * L + torch.randint(0, L, letters.shape, generator=gen)
    ids = torch.where(torch.rand(letters.shape, generator=gen) < 0.5, leaf, pair)  # [N, n+1]
    q = letters[:, -1]
    ids[:, -1] = torch.where(q == y, leaf[:, -1], 1 + L * R + q * L + y)
    return ids


def retrieval_worst_letters(cfg: TaskConfig, n: int, theta: float) -> tuple[Tensor, Tensor]:
    """The hardest valid inputs of length n, one per match position: (letters [n+1, n+1], y [n+1]).

    Logits depend on d = letter - y (mod A) and every non-matching key may take any d != 0
    independently, so the smallest margin and the largest softmax leak for a given match position
    come from giving each other key its highest-logit letter (offset k: argmax_d cos(d omega + k theta)).
    """
    A = cfg.alphabet_size
    omega = 2 * math.pi / A
    k = torch.arange(n, -1, -1, dtype=torch.float64)  # [n+1] offset n - j of key j
    d = torch.arange(1, A, dtype=torch.float64)
    best = torch.cos(d[None, :] * omega + k[:, None] * theta).argmax(1) + 1  # [n+1] best d per key
    letters = best.repeat(n + 1, 1)  # [m, j]; y = 0 so the letter is d itself
    letters.fill_diagonal_(0)  # the match sits at position m
    return letters, torch.zeros(n + 1, dtype=torch.long)


def retrieval_inputs(
    cfg: TaskConfig, n: int, theta: float, *, limit: int = 1_000_000, samples: int = 100_000, seed: int = 0
) -> tuple[Tensor, bool]:
    """Valid inputs of length n (exactly one key whose left letter is the looked-up letter): all of
    them when there are at most `limit`, else `samples` random ones plus the hardest ones."""
    A = cfg.alphabet_size
    gen = torch.Generator().manual_seed(seed)
    if A * (n + 1) * (A - 1) ** n <= limit:
        grid = torch.cartesian_prod(*[torch.arange(A)] * (n + 2)).reshape(-1, n + 2)  # [A^(n+2), n+2]
        letters, y = grid[:, :-1], grid[:, -1]
        keep = (letters == y[:, None]).sum(1) == 1
        return _letter_tokens(cfg, letters[keep], y[keep], gen), True
    y = torch.randint(0, A, (samples,), generator=gen)
    other = torch.randint(1, A, (samples, n + 1), generator=gen)  # d != 0
    letters = (y[:, None] + other) % A
    m = torch.randint(0, n + 1, (samples,), generator=gen)
    letters[torch.arange(samples), m] = y
    worst, wy = retrieval_worst_letters(cfg, n, theta)
    return _letter_tokens(cfg, torch.cat([letters, worst]), torch.cat([y, wy]), gen), False


# ---- verification of one construction at one length ---------------------------------------------------

HEADS = ("index", "retrieval")


def target_key(cfg: TaskConfig, ids: Tensor) -> Tensor:
    """Key position [B] the query (last token) must attend to: n - sigma / the unique match / itself."""
    n = ids.shape[1] - 1
    q = ids[:, -1]
    if cfg.task == "number":
        return torch.where((q >= 1) & (q <= cfg.int_range), n - q, n)
    left, looks_up = letter_of(cfg)
    match = left[ids] == looks_up[q][:, None]  # [B, n+1]
    return torch.where(left[q] == looks_up[q], n, match.double().argmax(1))


def _function(cfg: TaskConfig, ids: Tensor) -> Tensor:
    """The function the construction for `cfg`'s task computes, at the last position [B]."""
    if cfg.task == "number":
        return selective_index(cfg, ids)[:, -1]
    return retrieval(cfg, ids, last_only=True)[:, 0]


def check_length(head: Head, cfg: TaskConfig, ids: Tensor, beta: float | None = None) -> dict:
    """Hard-attention exactness and logit gaps on inputs `ids` [N, n + 1] of one length; with `beta`,
    also the softmax at that inverse temperature: decoded correctly, least mass on the target key."""
    want = _function(cfg, ids)  # [N]
    logits = attention_logits(head, ids, last_only=True)  # [N, 1, n+1]
    hard = apply(head, ids, last_only=True, logits=logits)[:, 0]
    out = {"correct": (hard == want).double().mean().item(), **gap_stats(logit_gaps(logits[:, 0]))}
    if beta is not None:
        logits = logits * (beta / head.beta)
        soft = apply(head, ids, hard=False, last_only=True, logits=logits)[:, 0]
        mass = torch.softmax(logits[:, 0], -1).gather(1, target_key(cfg, ids)[:, None])  # [N, 1]
        out.update(softmax_correct=(soft == want).double().mean().item(), min_target_mass=mass.min().item())
    return out


def hardest_inputs(cfg: TaskConfig, n: int, theta: float) -> Tensor:
    """Inputs of length n that attain the smallest margin and need the largest beta (exactly)."""
    if cfg.task == "number":
        return index_inputs(cfg, n)[:: cfg.vocab_size - 1]  # logits depend on the query token only
    letters, y = retrieval_worst_letters(cfg, n, theta)
    return _letter_tokens(cfg, letters, y, torch.Generator().manual_seed(0))


def needed_beta(head: Head, cfg: TaskConfig, n: int, eps: float) -> tuple[float, float]:
    """(smallest beta putting >= 1 - eps on the target key of every length-n input, Lemma F.1's
    bound log(n (1 - eps) / eps) / Delta(n)), both on beta = 1 logits."""
    ids = hardest_inputs(cfg, n, head.theta)
    logits = attention_logits(head, ids, last_only=True)[:, 0]  # [N, n+1]
    beta = min_beta(logits, target_key(cfg, ids), eps).max().item()
    return beta, lemma_beta(logit_gaps(logits).min(), n + 1, eps).item()


# ---- bounds of Theorem 3.2 (|v| = 1) ------------------------------------------------------------------


def index_bound(theta: float, n: int) -> float:
    """Theorem 3.2: Delta_Index(n) <= min(1 - cos theta, 2 pi^2 / n^2)."""
    return min(1 - math.cos(theta), 2 * math.pi**2 / n**2)


def retrieval_bound(theta: float, alphabet_size: int, n: int) -> float:
    """Theorem 3.2: Delta_Retrieval(n) <= 1 - cos(omega - n theta), for n theta < omega / 2."""
    return 1 - math.cos(2 * math.pi / alphabet_size - n * theta)


def discrepancy_curve(theta: float, ns, *, alphabet_size: int = 8) -> list[dict]:
    """Measured Delta(n) (exact: over the hardest inputs) and the bound, both heads, for n in `ns`.

    Retrieval rows have `valid` False where n theta >= omega / 2 (the theorem's condition fails).
    """
    ns = list(ns)
    num = TaskConfig("number", int_range=max(16, max(ns)))
    let = TaskConfig("letter", alphabet_size=alphabet_size)
    omega = 2 * math.pi / alphabet_size
    rows = []
    for head, cfg, bound in [
        (index_head(num, theta), num, lambda n: index_bound(theta, n)),
        (retrieval_head(let, theta), let, lambda n: retrieval_bound(theta, alphabet_size, n)),
    ]:
        for n in ns:
            ids = hardest_inputs(cfg, n, theta)
            delta = logit_gaps(attention_logits(head, ids, last_only=True)[:, 0]).min().item()
            kind = "index" if cfg.task == "number" else "retrieval"
            valid = kind == "index" or n * theta < omega / 2
            rows.append({"head": kind, "theta": theta, "n": n, "delta": delta, "bound": bound(n), "valid": valid})
    return rows


# ---- every check of `posym theory` ---------------------------------------------------------------------


@dataclass
class TheoryConfig:
    """What `posym theory` verifies and plots."""

    n0: list[int] = dataclasses.field(default_factory=lambda: [8, 16, 32, 64])
    """Largest lengths to verify (each length n <= n0 is checked; n = query position, n + 1 tokens)."""
    index_freq_id: int = 2
    """RoPE frequency ID of T_Index's plane (2: theta = 0.866, a positional layer's plane)."""
    retrieval_freq_id: int = 42
    """RoPE frequency ID of T_Retrieval's plane (42: theta = 0.0027); needs theta < omega / (2 n0)."""
    rope_base: float = 10_000.0
    """RoPE base of the frequencies g_k = base^(-2(k - 1) / rotary_dim)."""
    rotary_dim: int = 128
    """Rotary dimensions of the head (the paper's model: 128, 64 frequencies)."""
    alphabet_size: int = 8
    """Letters of T_Retrieval (omega = 2 pi / alphabet_size); the paper's letter task has 8."""
    eps: float = 0.01
    """Softmax criterion: the inverse temperature must put >= 1 - eps on the target key."""
    samples: int = 100_000
    """Random valid Retrieval inputs at each n in n0 when the inputs are too many to enumerate."""
    exhaustive_limit: int = 100_000
    """Enumerate every valid Retrieval input of a length when there are at most this many."""
    full_check_max_n: int = 4
    """Lengths up to this (and those in n0) are checked on their full input sets; every other
    length on its hardest inputs only (which decide correctness and beta exactly)."""
    task_samples: int = 2_000
    """Paper-task test samples for the multi-hop composition and the head scores."""
    curve_freq_ids: list[int] = dataclasses.field(default_factory=lambda: [2, 42])
    """Frequency IDs whose discrepancy curves Fig. 5A shows (a trained model's weighted IDs fit here)."""
    curve_max_n: int = 100
    """Lengths 1..curve_max_n of the discrepancy curves."""
    seed: int = 0
    """Seed of the sampled inputs and task samples."""

    def __post_init__(self) -> None:
        if not self.n0 or min(self.n0) < 1:
            raise PosymError("n0 must be a non-empty list of lengths >= 1")
        if not 0 < self.eps < 0.5:
            raise PosymError(f"eps must be in (0, 0.5) so that mass >= 1 - eps decodes correctly, got {self.eps}")
        if self.curve_max_n < 2 or self.samples < 1 or self.task_samples < 1:
            raise PosymError("curve_max_n must be >= 2 and samples, task_samples >= 1")


def verify(config: TheoryConfig) -> list[dict]:
    """One row per (head, n <= max n0): exactness, gaps, Theorem 3.2's bound, needed and Lemma F.1 beta.

    Every length checks its hardest inputs (exact for correctness and beta); lengths in n0 and up to
    full_check_max_n also check T_Index on every (query token, pointed-to token) and T_Retrieval on
    every valid input when few enough, else on `samples` random ones plus the hardest.
    """
    top = max(config.n0)
    angle = lambda k: frequency_angle(k, base=config.rope_base, rotary_dim=config.rotary_dim)  # noqa: E731
    th_i, th_r = angle(config.index_freq_id), angle(config.retrieval_freq_id)
    A = config.alphabet_size
    if th_r >= math.pi / (A * top):
        raise PosymError(
            f"T_Retrieval needs theta < omega / (2 n0) = {math.pi / (A * top):.4g} for "
            f"n0 = {top}, but frequency ID {config.retrieval_freq_id} gives {th_r:.4g}"
        )
    num = TaskConfig("number", int_range=max(16, top))
    let = TaskConfig("letter", alphabet_size=A)
    rows = []
    for kind, cfg, head in [("index", num, index_head(num, th_i)), ("retrieval", let, retrieval_head(let, th_r))]:
        for n in range(1, top + 1):
            beta, beta_lemma = needed_beta(head, cfg, n, config.eps)
            if n > config.full_check_max_n and n not in config.n0:
                ids, how = hardest_inputs(cfg, n, head.theta), "hardest"
            elif kind == "index":
                ids, how = index_inputs(cfg, n, config.seed), "exhaustive"
            else:
                ids, full = retrieval_inputs(
                    cfg, n, th_r, limit=config.exhaustive_limit, samples=config.samples, seed=config.seed + n
                )
                how = "exhaustive" if full else "sampled+hardest"
            bound = index_bound(th_i, n) if kind == "index" else retrieval_bound(th_r, A, n)
            rows.append(
                {
                    "head": kind,
                    "theta": head.theta,
                    "n": n,
                    "input_set": how,
                    "bound": bound,
                    "beta_needed": beta,
                    "beta_lemma": beta_lemma,
                    **check_length(head, cfg, ids, beta),
                }
            )
    return rows


def summarize_lengths(rows: list[dict], n0: list[int]) -> list[dict]:
    """Per (head, n0): exact on every length <= n0, the beta needed for all of them and Lemma F.1's."""
    out = []
    for kind in HEADS:
        for top in sorted(n0):
            sub = [r for r in rows if r["head"] == kind and r["n"] <= top]
            out.append(
                {
                    "head": kind,
                    "n0": top,
                    "theta": sub[0]["theta"],
                    "exact": all(r["correct"] == 1.0 for r in sub),
                    "softmax_exact": all(r["softmax_correct"] == 1.0 for r in sub),
                    "inputs": sum(r["inputs"] for r in sub),
                    "delta_n0": sub[-1]["delta"],
                    "bound_n0": sub[-1]["bound"],
                    "beta_needed": max(r["beta_needed"] for r in sub),
                    "beta_lemma": max(r["beta_lemma"] for r in sub),
                }
            )
    return out
