"""RoPE plane aliasing of keys beyond the training distances: the number model's length cliff (issue 28).

A plane of angle theta (radians per position) scores a query against a key through their relative angle
(n - j) theta only, so a key d positions further back than the key a head should attend to (its target)
differs from the target on that plane by the angle d theta, and looks like it when d theta is near a whole
number of turns. `alias_gap(d, theta)` is that distance from the nearest multiple of 2 pi, in [0, pi]: on
plane ID 1 of the paper's RoPE (theta = 1) it is 0.018 at d = 44 (44 - 14 pi), the nearest coincidence below
88, and 0.15 / 0.13 at d = 19 / 25. The number task's training prompts (17 tokens) hold no key more than 16
positions from a query, so only a lengthened prompt holds keys 44 beyond a target.

What is measured here (docs/results.md, "The number cliff, measured"), from the model's own pre-softmax
logits (float64, `posym.core.swaps`; never post-softmax weights read back):

- `key_planes`: per (prompt, query, layer, head) the key the head scores highest (top_key) against the key it
  should attend to (tracked_key, e.g. the chain's next position at a hop pointer), and every channel's share
  of the logit difference top minus tracked (`plane_gap_<ID>`: the channel of frequency ID <ID>; `free_gap`:
  the position-free dims), and the same for the average other key (`plane_others_<ID>`, `free_others`):
  where a head goes wrong, which plane gives the wrong key its advantage (or fails to take it away).
- `offset_histogram`: the offsets d = tracked_key - top_key of the rows where the top key is not the tracked
  one, against the null that the wrong key is uniform over the keys the query sees, with each offset's
  alias gap; `alias_share` sums it: the share of wrong keys within `NEAR` radians of a full turn, observed
  against expected.

>>> round(alias_gap(44), 4), round(alias_gap(19), 2), round(alias_gap(25), 2), round(alias_gap(6), 2)
(0.0177, 0.15, 0.13, 0.28)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from posym.core.interop import scorable
from posym.core.qk import check_layers
from posym.core.swaps import channel_logits, clean_logits, scan
from posym.errors import PosymError

NEAR = 0.2
"""Radians: an offset whose plane angle lies within this of a full turn counts as aliased. It holds the
offsets 19, 25, 44, 63, 69 and 88 of plane ID 1 (alias gaps 0.15, 0.13, 0.018, 0.17, 0.12, 0.04) and none
of 6, 13, 38, 50 (0.28, 0.43, 0.30, 0.27); fixed before any model was measured."""

KEY_COLUMNS = ("prompt", "query", "keys", "layer", "head", "tracked_key", "top_key", "logit_tracked", "logit_top")


def alias_gap(d, theta: float = 1.0):
    """Distance of d * theta from the nearest multiple of 2 pi, in [0, pi] (numbers or arrays)."""
    turned = np.mod(np.asarray(d, dtype=np.float64) * theta, 2 * math.pi)
    gap = np.minimum(turned, 2 * math.pi - turned)
    return float(gap) if np.ndim(gap) == 0 else gap


def key_planes(model, input_ids, queries, tracked, *, layers=None, batch_size: int = 32, progress=None):
    """Per (prompt, query, layer, head): the top key, the tracked key and each channel's share of their
    logit difference (top minus tracked), from one capture pass per batch (float64).

    input_ids: 1-D id sequences; queries: per prompt a list of positions (`posym.core.swaps.query_batches`);
    tracked: callable(prompt, query) -> the tracked key position (one for every head), which the query must
    see. Columns: KEY_COLUMNS, plane_gap_1 .. plane_gap_P (frequency IDs), free_gap (0 without pass-through
    dims), and plane_others_1 .. plane_others_P, free_others: each channel's share of the mean other visible
    key minus the tracked key's (what the channel does to a typical key). Where top_key == tracked_key every
    gap is 0. The channel gaps sum to logit_top - logit_tracked.
    """
    import pandas as pd

    model = scorable(model)
    layers = check_layers(model, layers)
    frames = []

    def layer_work(layer, qk, jobs):
        found = []
        heads = list(range(qk.q.shape[1]))
        planes = qk.cos.shape[-1] // 2
        for p, rows in jobs.items():
            first = qk.first_key(p)
            channels = channel_logits(qk, torch.tensor(rows), heads, p)  # [G, H, C, n]
            logits = clean_logits(qk, torch.tensor(rows), heads, p)  # [G, H, n]
            found.append((p, rows, first, channels, logits))
        return layer, planes, found

    for batch, results in scan(model, input_ids, queries, layer_work, layers=layers, batch_size=batch_size):
        for layer, planes, found in results:
            for p, rows, first, channels, logits in found:
                G, H, C, n = channels.shape
                top = logits.argmax(-1)  # [G, H] index into first..p
                want = torch.tensor([int(tracked(batch[row], p)) for row in rows])  # [G] absolute
                if bool(((want < first) | (want > p)).any()):
                    raise PosymError(f"a tracked key of query {p} is not among the keys it sees ({first}..{p})")
                want_i = (want - first)[:, None].expand(G, H)  # [G, H]
                at = lambda x, i: x.gather(-1, i[..., None].to(torch.long))[..., 0]  # noqa: E731  x [..., n], i [...]
                gaps = at(channels, top[:, :, None].expand(G, H, C)) - at(channels, want_i[:, :, None].expand(G, H, C))
                own = at(channels, want_i[:, :, None].expand(G, H, C))  # [G, H, C] the tracked key's shares
                others = (channels.sum(-1) - own) / max(n - 1, 1) - own  # [G, H, C] mean other key minus it
                frame = {
                    "prompt": np.repeat([batch[row] for row in rows], H),
                    "query": p,
                    "keys": n,
                    "layer": layer,
                    "head": np.tile(np.arange(H), G),
                    "tracked_key": np.repeat(want.numpy(), H),
                    "top_key": (top + first).flatten().numpy(),
                    "logit_tracked": at(logits, want_i).flatten().numpy(),
                    "logit_top": at(logits, top).flatten().numpy(),
                }
                for name, values in (("gap", gaps), ("others", others)):
                    flat = values.reshape(G * H, C).numpy()
                    for c in range(planes):
                        frame[f"plane_{name}_{c + 1}"] = flat[:, c]
                    frame[f"free_{name}"] = flat[:, planes] if C > planes else 0.0
                frames.append(pd.DataFrame(frame))
        if progress is not None:
            progress(len(batch))
    if not frames:
        raise PosymError("no prompts given")
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["prompt", "query", "layer", "head"], ignore_index=True)


def offset_histogram(rows, theta: float = 1.0):
    """Per offset d = tracked_key - top_key (> 0: further back than the tracked key) of the rows whose top
    key is not the tracked one: observed count, the count expected if each such row's top key were uniform
    over the other keys its query sees (columns query, keys, tracked_key, top_key: keys query - keys + 1 ..
    query), and alias_gap(d, theta). One row per offset any wrong row could reach, ordered by d.

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"query": [4, 4], "keys": 5, "tracked_key": 3, "top_key": [3, 0]})
    >>> offset_histogram(rows)[["offset", "observed", "expected"]].to_dict("list")
    {'offset': [-1, 1, 2, 3], 'observed': [0, 0, 0, 1], 'expected': [0.25, 0.25, 0.25, 0.25]}
    """
    import pandas as pd

    wrong = rows[rows.top_key != rows.tracked_key]
    expected: dict[int, float] = {}
    for (query, keys, tracked), count in wrong.groupby(["query", "keys", "tracked_key"]).size().items():
        first = int(query) - int(keys) + 1
        if keys < 2:
            continue
        for d in range(int(tracked) - int(query), int(tracked) - first + 1):
            if d != 0:
                expected[d] = expected.get(d, 0.0) + count / (keys - 1)
    observed = (wrong.tracked_key - wrong.top_key).value_counts()
    offsets = sorted(set(expected) | set(int(d) for d in observed.index))
    return pd.DataFrame(
        {
            "offset": offsets,
            "observed": [int(observed.get(d, 0)) for d in offsets],
            "expected": [expected.get(d, 0.0) for d in offsets],
            "alias_gap": alias_gap(np.array(offsets, dtype=np.float64), theta) if offsets else [],
        }
    )


def alias_share(histogram, near: float = NEAR) -> dict:
    """From `offset_histogram`: wrong keys in all, how many (and what share) lie within `near` radians of a
    full turn, the share expected under the uniform null, and the mean alias gap observed and expected.

    >>> import pandas as pd
    >>> h = pd.DataFrame({"offset": [44, 10], "observed": [3, 1], "expected": [1.0, 3.0], "alias_gap": [0.02, 2.57]})
    >>> {k: round(v, 3) for k, v in alias_share(h).items()}
    {'wrong': 4, 'aliased': 3, 'share': 0.75, 'expected_share': 0.25, 'gap_mean': 0.657, 'expected_gap_mean': 1.932}
    """
    total, expected = int(histogram.observed.sum()), float(histogram.expected.sum())
    near_rows = histogram.alias_gap < near
    aliased = int(histogram.observed[near_rows].sum())
    return {
        "wrong": total,
        "aliased": aliased,
        "share": aliased / total if total else float("nan"),
        "expected_share": float(histogram.expected[near_rows].sum()) / expected if expected else float("nan"),
        "gap_mean": float((histogram.observed * histogram.alias_gap).sum()) / total if total else float("nan"),
        "expected_gap_mean": float((histogram.expected * histogram.alias_gap).sum()) / expected
        if expected
        else float("nan"),
    }
