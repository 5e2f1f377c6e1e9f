"""RoPE geometry of attention heads: per-plane scores, frequency use, q/k planes (docs/method.md sections 3-4).

A RoPE head's logit is a sum over channels: one term per rotary plane (two dims rotated together
at angle theta_k per position; frequency ID k = 1 is the fastest plane) plus one position-free term
from the dims RoPE leaves alone (partial rotary). For a query at position p and a key at position
j the term of plane k is scale * (R_p q)_k . (R_j k_j)_k. Everything here is built from the swapped-
logit engine (`posym.core.swaps`: per-head pre-rotation queries/keys and the model's own rotary
tables from `posym.core.qk`), so it works on every family `posym.core.qk` supports (interleaved or
half-split planes, partial rotary included).

Definitions (what the numbers in Table 1 / Fig. 8 mean here):
- channel logits: plane k's own contribution to the query's logits over the keys it sees (0..p; on
  a sliding-window layer only the window's, docs/windows.md).
- frequency IDs and theta are per layer: each layer's planes are read off its own rotary tables, so
  a model with local and global RoPE bases (Gemma 3: 10,000 and 1,000,000) reports plane k of a local
  layer at the local base's theta_k and of a global layer at the global one (`frequency`, `rope_base`).
- max_logit of a channel on one (prompt, query): the largest of those contributions (docs/method.md section 4, the
  paper's "max logit per frequency", Fig. 4C). "use" of a channel = max_logit averaged over all
  (prompt, query) rows.
- weighted frequency ID of a head = sum_k k * w_k / sum_k w_k over its P rotary planes k = 1..P (the
  position-free channel has no frequency ID and is reported as `free_use`). The paper does not
  define w_k, so every weighting below is reported (`WEIGHTINGS`, columns weighted_id_<name>), each
  beside the uniform baseline uniform_id = (P + 1) / 2 (what equal weights give) and `planes` = P:
  - linear: w_k = max(use_k, 0) (column weighted_id too): a plane whose best contribution is
    negative never attracts attention, so it gets weight 0; every plane with a small positive use
    pulls the mean toward (P + 1) / 2;
  - dominant: all weight on the plane of largest use (= dominant_id);
  - floor: w_k = max(use_k - median_j use_j, 0): only planes used more than the head's median plane
    count, by their excess, so the flat bulk of weakly used planes drops out;
  - sharpened: w_k = exp(use_k) / sum_j exp(use_j), a softmax over planes in logit units: the weight
    each plane would get if the planes competed like keys in attention (equal uses: uniform).
  The linear weighting also gives weighted_frequency (the same average of theta_k, radians).
- per-plane scores: each channel scored as its own head (softmax of its own logits, swap scores of
  `posym.core.scores.swap_scores`), the frequency-resolved analysis of 2511.

Public API
- `plane_scores(model, input_ids, queries=None, *, layers=None, heads=None, tau=1e-4)`: one row per
  (prompt, query, layer, head, channel) with frequency_id, frequency, s_pos, s_sym, max_logit.
- `frequency_use(planes)`: per head weighted_id (+ every weighting), weighted_frequency, dominant_id,
  dominant_frequency, rope_base, free_use, planes, uniform_id; `weighted_ids(ids, use)` the weightings
  of one head; `layer_bases(planes)` the RoPE base of every layer.
- `qk_projection(model, input_ids, layer, head, frequency_id)`: one prompt's queries and keys on
  one plane (Fig. 4B), before and after rotation.
`posym geometry` (loading, Parquet tables, JSON summary, figures) is `posym.commands.geometry`.
"""

from __future__ import annotations

import torch

from posym.core import swaps
from posym.core.interop import scorable
from posym.core.paper import TAU
from posym.core.qk import as_batch, check_layers, head_qk, pair_planes, rotate
from posym.core.scores import swap_scores
from posym.errors import PosymError

PLANE_COLUMNS = (
    "prompt",
    "query",
    "layer",
    "head",
    "keys",
    "channel",
    "frequency_id",
    "frequency",
    "s_pos",
    "s_sym",
    "max_logit",
)


def plane_angles(cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """theta_k [r / 2] (radians per position) of every plane, read off the model's own tables
    cos/sin [T, r] (T >= 2, positions from 0) at position 1; scaled tables (YaRN) keep the angle."""
    r = cos.shape[-1]
    c, s = pair_planes(cos[1], pairing, r)[:, 0], pair_planes(sin[1], pairing, r)[:, 0]  # [r/2]
    return torch.atan2(s.double(), c.double()) - torch.atan2(
        pair_planes(sin[0], pairing, r)[:, 0].double(), pair_planes(cos[0], pairing, r)[:, 0].double()
    )


def plane_scores(
    model, input_ids, queries=None, *, layers=None, heads=None, tau: float = TAU, batch_size: int = 64, progress=None
):
    """Per-channel scores and max logits, one row per (prompt, query, layer, head, channel).

    input_ids: 1-D id sequences (lengths may differ). queries: "last" (default), "all" or per prompt
    a list of positions. layers/heads: indices (default all). Channel c < r/2 is the plane of
    frequency ID c + 1 (`frequency` = its theta, read off that layer's own rotary tables: a local and
    a global layer of Gemma 3 differ); the position-free channel, if the head has non-rotary dims, has
    frequency_id 0 and frequency 0. The channels' logits sum to the head's. keys: the keys the query
    sees (query + 1, or the layer's sliding window), over which the channel's row and swaps run.
    """
    import pandas as pd

    model = scorable(model)  # nnsight / TransformerLens models too (posym.core.interop)
    layers = check_layers(model, layers)
    n_heads = model.config.num_attention_heads
    heads = list(range(n_heads)) if heads is None else sorted(set(heads))
    if not heads or any(not 0 <= h < n_heads for h in heads):
        raise PosymError(f"heads must be indices in 0..{n_heads - 1}, got {heads}")

    def layer_rows(layer, qk, jobs):
        theta = plane_angles(qk.cos[0], qk.sin[0], qk.pairing).cpu()  # [r/2], off the model's device
        channels = theta.shape[0] + (qk.q.shape[-1] > qk.cos.shape[-1])
        ids = torch.arange(1, channels + 1) % (theta.shape[0] + 1)  # free channel -> ID 0
        freq = torch.cat((theta, torch.zeros(channels - theta.shape[0], dtype=theta.dtype)))
        frames = []
        for p, rows in jobs.items():
            n = p - qk.first_key(p) + 1  # the keys query p sees (a sliding window's on a local layer)
            step = max(1, swaps.BUDGET // (len(heads) * channels * n**2))
            for lo in range(0, len(rows), step):
                chunk = rows[lo : lo + step]
                swapped = swaps.plane_swap_logits(qk, torch.tensor(chunk), heads, p)  # [G, H, C, n, n]
                clean = swapped.diagonal(dim1=-2, dim2=-1)  # [G, H, C, n]
                res = swap_scores(clean, swapped, tau=tau)
                shape = clean.shape[:-1]  # [G, H, C]
                frames.append(
                    pd.DataFrame(
                        {
                            "row": torch.tensor(chunk)[:, None, None].expand(shape).flatten(),
                            "query": p,
                            "layer": layer,
                            "keys": n,
                            "head": torch.tensor(heads)[None, :, None].expand(shape).flatten(),
                            "channel": torch.arange(channels)[None, None].expand(shape).flatten(),
                            "frequency_id": ids[None, None].expand(shape).flatten(),
                            "frequency": freq[None, None].expand(shape).flatten(),
                            "s_pos": res["s_pos"].flatten().cpu(),
                            "s_sym": res["s_sym"].flatten().cpu(),
                            "max_logit": clean.amax(-1).flatten().cpu(),
                        }
                    )
                )
        return frames

    frames = []
    for batch, results in swaps.scan(
        model, input_ids, queries, layer_rows, layers=layers, batch_size=batch_size, progress=progress
    ):
        for frame in (f for layer_frames in results for f in layer_frames):
            frame.insert(0, "prompt", [batch[row] for row in frame.pop("row")])
            frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["prompt", "query", "layer", "head", "channel"], ignore_index=True)[list(PLANE_COLUMNS)]


def layer_bases(planes) -> dict[int, float]:
    """{layer: RoPE base} read off a plane table (`plane_scores` or `channel_means` rows): theta_2^(-P)
    for the layer's P rotary planes (`frequency_use`'s rope_base; NaN with fewer than two planes)."""
    rotary = planes[planes.frequency_id > 0]
    out = {}
    for layer, g in rotary.groupby("layer"):
        second = g.frequency[g.frequency_id == 2]
        out[int(layer)] = float(second.iloc[0]) ** -int(g.frequency_id.max()) if len(second) else float("nan")
    return out


def channel_means(planes):
    """Per (layer, head, channel): mean s_pos, s_sym and use (= mean max_logit) over (prompt, query)."""
    return planes.groupby(["layer", "head", "channel", "frequency_id", "frequency"], as_index=False).agg(
        s_pos=("s_pos", "mean"), s_sym=("s_sym", "mean"), use=("max_logit", "mean")
    )


WEIGHTINGS = ("linear", "dominant", "floor", "sharpened")
"""Names of the plane weightings of the weighted frequency ID (defined in the module docstring)."""


def plane_weights(use, weighting: str):
    """w_k [P] of one head's rotary planes from their uses [P] (float64 numpy), unnormalised."""
    import numpy as np

    use = np.asarray(use, dtype=np.float64)
    if weighting == "linear":
        return use.clip(min=0)
    if weighting == "dominant":
        return (np.arange(len(use)) == np.argmax(use)).astype(np.float64)
    if weighting == "floor":
        return (use - np.median(use)).clip(min=0)
    if weighting == "sharpened":
        return np.exp(use - use.max())  # the softmax's shift: same ratios, no overflow
    raise PosymError(f"unknown weighting {weighting!r}; choose one of {', '.join(WEIGHTINGS)}")


def weighted_ids(ids, use) -> dict[str, float]:
    """{weighting: sum_k ids_k w_k / sum_k w_k} for every name of WEIGHTINGS (NaN where all w_k = 0)."""
    import numpy as np

    ids = np.asarray(ids, dtype=np.float64)
    out = {}
    for name in WEIGHTINGS:
        w = plane_weights(use, name)
        out[name] = float(w @ ids / w.sum()) if w.sum() > 0 else float("nan")
    return out


def frequency_use(planes):
    """Per (layer, head): weighted_id (linear) and weighted_id_<name> for each of WEIGHTINGS,
    weighted_frequency, dominant_id, dominant_frequency (its theta), rope_base, free_use, planes and
    uniform_id (module docstring). Angles are the layer's own (its `frequency` column): rope_base =
    theta_2^(-P), the base b of theta_k = b^(-(k - 1) / P) for P planes (exact for unscaled RoPE; a
    scaled table's effective base), so Gemma 3's local and global layers show 10,000 and 1,000,000.

    planes: rows of `plane_scores` or `channel_means` (a `use` column is taken as already averaged).
    A weighted ID is NaN when its weights are all 0 (linear: no rotary plane has a positive use).
    """
    import numpy as np
    import pandas as pd

    means = planes if "use" in planes.columns else channel_means(planes)
    rows = []
    for (layer, head), g in means.groupby(["layer", "head"]):
        rotary = g[g.frequency_id > 0].sort_values("frequency_id")
        use = rotary.use.to_numpy()
        w = plane_weights(use, "linear")
        total = w.sum()
        free = g.use[g.frequency_id == 0]
        ids = weighted_ids(rotary.frequency_id.to_numpy(), use)
        theta = rotary.frequency.to_numpy()  # [P], this layer's own angles
        rows.append(
            {
                "layer": layer,
                "head": head,
                "weighted_id": ids["linear"],
                **{f"weighted_id_{name}": value for name, value in ids.items()},
                "weighted_frequency": float(w @ rotary.frequency.to_numpy() / total) if total > 0 else float("nan"),
                "dominant_id": int(rotary.frequency_id.to_numpy()[np.argmax(use)]),
                "dominant_frequency": float(theta[np.argmax(use)]),
                "rope_base": float(theta[1] ** -len(theta)) if len(theta) > 1 and theta[1] > 0 else float("nan"),
                "free_use": float(free.iloc[0]) if len(free) else float("nan"),
                "planes": len(rotary),
                "uniform_id": (len(rotary) + 1) / 2,
            }
        )
    return pd.DataFrame(rows)


def qk_projection(model, input_ids, layer: int, head: int, frequency_id: int):
    """One prompt's queries and keys of `head` on the plane `frequency_id` (Fig. 4B).

    One row per (position, role in {query, key}): token id, (x, y) the pre-rotation coordinates
    (what the head's projection writes; T_Index: all keys one vector, queries turned back by their
    offset) and (x_rot, y_rot) after RoPE rotated them by their own position.
    """
    import pandas as pd

    model = scorable(model)
    qk = head_qk(model, as_batch(model, [input_ids]), [layer])[layer]
    r = qk.cos.shape[-1]
    if not 1 <= frequency_id <= r // 2:
        raise PosymError(f"frequency_id must lie in 1..{r // 2} (the head's rotary planes), got {frequency_id}")
    if not 0 <= head < qk.q.shape[1]:
        raise PosymError(f"head must lie in 0..{qk.q.shape[1] - 1}, got {head}")
    ids = list(map(int, input_ids))
    rows = []
    for role, x in (("query", qk.q[0, head]), ("key", qk.k[0, head])):  # [T, d]
        x = x.double()
        turned = rotate(x, qk.cos[0].double(), qk.sin[0].double(), qk.pairing)  # [T, d]
        plane = pair_planes(x, qk.pairing, r)[:, frequency_id - 1]  # [T, 2]
        plane_rot = pair_planes(turned, qk.pairing, r)[:, frequency_id - 1]  # [T, 2]
        for t in range(len(ids)):
            rows.append(
                {
                    "position": t,
                    "role": role,
                    "token": ids[t],
                    "x": float(plane[t, 0]),
                    "y": float(plane[t, 1]),
                    "x_rot": float(plane_rot[t, 0]),
                    "y_rot": float(plane_rot[t, 1]),
                }
            )
    frame = pd.DataFrame(rows)
    frame.insert(0, "layer", layer)
    frame.insert(1, "head", head)
    frame.insert(2, "frequency_id", frequency_id)
    return frame


def index_alignment(projection, offsets: dict[int, int]) -> dict[str, float]:
    """How close one head's plane (a `qk_projection`) is to T_Index (Fig. 4B, docs/method.md section 5), as numbers.

    offsets: token id -> the offset sigma it encodes (the number task's integers). T_Index writes every
    key as the same vector and turns an integer's query back by sigma * theta, so after RoPE the query
    at position p points exactly at the key at p - sigma. Returns
    - key_concentration: |mean of the unit key vectors| before rotation (1: one direction; ~0: spread);
    - query_concentration: the same over the queries of integers (they fan out: lower);
    - phase_error_deg: median over integer queries with p - sigma >= 0 of the angle, after rotation,
      between the query at p and the key at p - sigma (0 for T_Index; 90 for unrelated directions);
    - target_nearest: fraction of those queries for which that key is the nearest in angle among keys
      0..p (the plane's direction alone picks the target; key norms, which differ by token, left out);
    - queries: how many integer queries entered the last two.
    """
    import numpy as np

    keys = projection[projection.role == "key"].set_index("position").sort_index()
    queries = projection[(projection.role == "query") & projection.token.isin(list(offsets))]

    def concentration(frame) -> float:
        angles = np.arctan2(frame.y.to_numpy(), frame.x.to_numpy())
        return float(np.abs(np.exp(1j * angles).mean())) if len(angles) else float("nan")

    errors, nearest = [], []
    k_rot = keys[["x_rot", "y_rot"]].to_numpy()  # [T, 2]
    k_unit = k_rot / np.linalg.norm(k_rot, axis=1, keepdims=True)  # [T, 2]
    for q in queries.itertuples():
        target = q.position - offsets[int(q.token)]
        if target < 0:
            continue
        q_rot = np.array([q.x_rot, q.y_rot])  # [2]
        angle = np.arctan2(q_rot[1], q_rot[0]) - np.arctan2(k_rot[target, 1], k_rot[target, 0])
        errors.append(abs(np.degrees(np.angle(np.exp(1j * angle)))))  # wrapped to [0, 180]
        nearest.append(int(np.argmax(k_unit[: q.position + 1] @ q_rot)) == target)
    return {
        "key_concentration": concentration(keys),
        "query_concentration": concentration(queries),
        "phase_error_deg": float(np.median(errors)) if errors else float("nan"),
        "target_nearest": float(np.mean(nearest)) if nearest else float("nan"),
        "queries": len(errors),
    }
