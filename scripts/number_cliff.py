"""The number model's length cliff, measured (issue 28): where it falls, where its heads go, which plane.

The committed hypothesis (docs/results.md, issue 28): the positional layers rely on RoPE plane ID 1
(theta = 1 radian per position), which cannot tell a key 44 positions beyond the target from the target
(44 - 14 pi = 0.018 rad), and only prompts of about 51+ tokens hold such keys. This script measures it on one
checkpoint of a number-task run (read only):

1. accuracy at fine lengths from the training length to 128 (the same test questions at every length,
   lengthened by lengthgen's extra target-window tokens), per hop, with Wilson 95% intervals;
2. for the wrong answers, where the predicted symbol sits relative to the answer (when it occurs once in
   the prompt); for every head at every chain pointer, the key it scores highest against the chain's next
   position (`posym.core.aliasing.key_planes`), and the offsets of the wrong keys against the uniform null
   (`offset_histogram`, `alias_share`);
3. per RoPE plane, the wrong key's logit minus the chain key's, at the positional heads (queries and keys,
   float64; never post-softmax weights);
4. an inference-time causal check (`posym.core.interventions.far_planes_removed`): plane ID 1 of the
   positional heads gives no logit to keys farther than the training prompts' longest distance (16), the
   identity at the training length; controls: a random other plane of the same heads (3 draws), plane ID 1
   of as many random non-positional heads (3 draws), plane ID 1 removed for every key (`ablated_planes`),
   and the far keys of the positional heads lowered by a constant, plane ID 1's mean share of their logits
   (the same average shift as the removal, without its selectivity). `--planes` runs the same check on
   other planes (e.g. `--planes 2` or `--planes 9-64`: IDs 9-64 removed together from the far keys; the
   random-plane control then draws as many other planes), into interventions-<tag>.parquet and
   shifts-<tag>.parquet beside the plane-ID-1 tables (tag: `plane_tag`, e.g. id2, ids9_64).

Writes into --out (default docs/results/number-cliff):

    accuracy.parquet        length, hop (0 = all), n, correct, acc, lo, hi
    answer_offsets.parquet  length, offset (answer position minus the predicted symbol's), observed, expected
                            (each wrong answer's symbol uniform over the other target-region positions),
                            alias_gap; only wrong answers whose symbol occurs once in the prompt
    heads.parquet           length, layer, label, rows (chain pointers), wrong (top key != chain key), share,
                            lo, hi, margin_median (top-1 minus top-2 logit)
    head_offsets.parquet    length, offset, observed, expected, alias_gap: wrong keys of the positional heads
                            at the (prompt, pointer, layer) rows whose top key was the chain key at 17 tokens
    top_keys.parquet        length, top_key (absolute position), rows: where those wrong keys sit
    alias.parquet           length, source (positional heads / answers): `alias_share` of each histogram
    planes.parquet          length, layer, those wrong rows of the positional heads: mean logit gap (top minus chain
                            key) in all and by channel group (ID 1, IDs 2-8, IDs 9-64 + free), and by group
                            the mean other key's gap (*_others), bootstrap 95% intervals over prompts
    interventions.parquet   condition, draw, length, n, correct, acc, lo, hi
    shifts.parquet          length, layer, shift: the mean-shift control's penalty (plane ID 1's mean share of
                            the far keys' logits at the chain pointers of the first 64 prompts)
    summary.json            run, step, labels, the stages of the last call and their wall time, manifest
                            (seeds, versions, config hash)
    interventions-<tag>.parquet, shifts-<tag>.parquet   the same two for `--planes` other than 1
    quoted.json             the numbers docs/results.md quotes, recomputed from the tables (`headline`)

    python scripts/number_cliff.py RUN --step STEP [--out DIR] [--n 480] [--head-prompts 128]
    python scripts/number_cliff.py RUN --step STEP --stages causal --planes 9-64 --out DIR
    python scripts/number_cliff.py RUN --step STEP --stages summary     # quoted.json from the tables
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import pandas as pd  # noqa: E402

from posym.core.aliasing import alias_gap, alias_share, key_planes, offset_histogram  # noqa: E402
from posym.core.interventions import ablated_planes, far_planes_removed, gptj_rotary_dim, label_heads  # noqa: E402
from posym.core.lengthgen import ALL_HOPS, HEAD_GAMMA, LABEL_PROMPTS, extension  # noqa: E402
from posym.core.swaps import channel_logits, scan  # noqa: E402
from posym.core.stats import bootstrap_weights, percentile_interval, wilson_interval  # noqa: E402
from posym.core.tasks import generate  # noqa: E402
from posym.core.train import answer_logits  # noqa: E402
from posym.errors import PosymError  # noqa: E402
from posym.io import manifest, write_json, write_parquet  # noqa: E402
from posym.models import load_checkpoint  # noqa: E402

OUT = ROOT / "docs" / "results" / "number-cliff"
LENGTHS = [17, 24, 30, 34, 38, *range(40, 73, 2), 76, 80, 88, 96, 104, 112, 120, 128]
"""Accuracy lengths: every 2 tokens across 40-72 (where the cliff is), coarser before and after."""
HEAD_LENGTHS = [17, 51, 56, 60, 64, 68, 80, 128]
"""Lengths of the head-level measures (the training length, the cliff, and beyond)."""
CAUSAL_LENGTHS = [17, 56, 60, 68, 128]
"""Lengths of the causal check (17: the intervention must be the identity there)."""
DRAWS = 3
"""Random draws of each control of the causal check."""
FAST = range(2, 9)
"""Frequency IDs 2-8, the next fastest planes (theta 0.87 ... 0.37), one channel group of the decomposition."""
ROPE_BASE, PLANES = 10000.0, 64
"""The paper model's RoPE (base 10,000, 64 planes): theta_k = base^(-(k - 1) / 64) of frequency ID k."""
SHIFT_PROMPTS = 64
"""Prompts per length over which the mean-shift control measures the planes' mean share of the far keys."""
DEFAULT_PLANES = "1"
"""The planes of the causal check unless `--planes` says otherwise: plane ID 1, the committed hypothesis."""
SEED = 0
"""Test-data seed (lengthgen's default) and the seed of the bootstrap and random draws."""


def r3(x) -> float:
    """A quoted number: three decimals."""
    return round(float(x), 3)


def wilson_row(correct: np.ndarray) -> dict:
    lo, hi = wilson_interval(int(correct.sum()), len(correct))
    return {"n": len(correct), "correct": int(correct.sum()), "acc": float(correct.mean()), "lo": lo, "hi": hi}


def predictions(model, samples, batch: int) -> np.ndarray:
    return np.concatenate([logits.argmax(-1).cpu().numpy() for logits, _ in answer_logits(model, samples, batch)])


def accuracy(model, base, n: int, lengths, batch_tokens: int):
    """accuracy rows and answer-offset histograms per length."""
    rows, offsets = [], []
    for length in lengths:
        task = extension(base, length)
        samples = generate(task, n, SEED, split="test")
        pred = predictions(model, samples, max(1, batch_tokens // length))
        correct = pred == samples.answer
        rows.append({"length": length, "hop": ALL_HOPS, **wilson_row(correct)})
        for h in range(1, base.max_hops + 1):
            rows.append({"length": length, "hop": h, **wilson_row(correct[samples.hops == h])})
        offsets.append(answer_offsets(task, samples, pred, length))
        print(f"accuracy {length}: {correct.mean():.3f}", flush=True)
    return pd.DataFrame(rows), pd.concat(offsets, ignore_index=True)


def answer_offsets(task, samples, pred, length: int) -> pd.DataFrame:
    """Offsets answer position minus predicted symbol's position of the wrong answers whose symbol occurs
    once, against each one's symbol uniform over the other target-region positions 0 .. E + T - 1."""
    last = task.target_start + task.target_size  # first position after the target region
    observed: dict[int, int] = {}
    expected: dict[int, float] = {}
    for ids, answer_pos, p, a in zip(samples.input_ids, samples.answer_pos, pred, samples.answer):
        where = np.flatnonzero(ids[:last] == p)
        if p == a or len(where) != 1:
            continue
        d = int(answer_pos - where[0])
        observed[d] = observed.get(d, 0) + 1
        for j in range(last):
            if j != answer_pos:
                expected[int(answer_pos - j)] = expected.get(int(answer_pos - j), 0.0) + 1 / (last - 1)
    offs = sorted(set(observed) | set(expected))
    return pd.DataFrame(
        {
            "length": length,
            "offset": offs,
            "observed": [observed.get(d, 0) for d in offs],
            "expected": [expected.get(d, 0.0) for d in offs],
            "alias_gap": alias_gap(np.array(offs, dtype=np.float64)) if offs else [],
        }
    )


def chain_queries(samples):
    """Per prompt its chain pointers (query and intermediates) and the tracked key of each: the next position."""
    queries, nxt = [], {}
    for k, (chain, hops) in enumerate(zip(samples.chain, samples.hops)):
        pointers = [int(chain[i]) for i in range(int(hops))]
        queries.append(pointers)
        for i, p in enumerate(pointers):
            nxt[(k, p)] = int(chain[i + 1])
    return queries, lambda prompt, query: nxt[(prompt, query)]


def head_tables(model, base, labels, n_prompts: int, lengths):
    positional = sorted(int(x) for x in labels.layer[labels.label == "positional"])
    if lengths[0] != base.seq_len:
        raise PosymError("the head measures start at the training length (their reference)")
    heads, hist, planes, measured, tops = [], [], [], [], []
    for length in lengths:
        samples = generate(extension(base, length), n_prompts, SEED, split="test")
        queries, tracked = chain_queries(samples)
        rows = key_planes(model, list(samples.input_ids), queries, tracked)
        rows["length"] = length
        measured.append(rows)
        for layer, group in rows.groupby("layer"):
            wrong = (group.top_key != group.tracked_key).to_numpy()
            lo, hi = wilson_interval(int(wrong.sum()), len(wrong))
            heads.append(
                {
                    "length": length,
                    "layer": int(layer),
                    "label": labels.set_index("layer").label[int(layer)],
                    "rows": len(wrong),
                    "wrong": int(wrong.sum()),
                    "share": float(wrong.mean()),
                    "lo": lo,
                    "hi": hi,
                }
            )
        pos = turned_wrong(rows[rows.layer.isin(positional)], measured[0], length - base.seq_len)
        hist.append(offset_histogram(pos).assign(length=length))
        planes.extend(plane_rows(pos, length))
        wrong = pos[pos.top_key != pos.tracked_key]
        tops.append(wrong.groupby("top_key").size().rename("rows").reset_index().assign(length=length))
        print(f"heads {length}: positional rows turned wrong {len(wrong)} of {len(pos)}", flush=True)
    hist = pd.concat([h for h in hist if len(h)], ignore_index=True).astype({"offset": int, "observed": int})
    return (
        pd.DataFrame(heads),
        hist,
        pd.DataFrame(planes),
        pd.concat(tops, ignore_index=True)[["length", "top_key", "rows"]],
    )


def turned_wrong(rows: pd.DataFrame, base: pd.DataFrame, extra: int) -> pd.DataFrame:
    """The rows whose (prompt, pointer, layer) scored the chain key highest at the training length (`base`,
    the first head length): a wrong top key among them is one the extra tokens made wrong."""
    right = base[base.top_key == base.tracked_key][["prompt", "query", "layer", "head"]]
    moved = right.assign(query=right["query"] + extra)  # the pointer sits extra positions later
    return rows.merge(moved, on=["prompt", "query", "layer", "head"], how="inner")


def channel_groups(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The logit gap (top minus chain key) of each row in all and by channel group."""
    ids = sorted(int(c.split("_")[-1]) for c in rows.columns if c.startswith("plane_gap_"))
    out = {"total": (rows.logit_top - rows.logit_tracked).to_numpy()}
    for name, suffix in (("gap", ""), ("others", "_others")):
        slow = [f"plane_{name}_{i}" for i in ids if i > max(FAST)]
        out[f"id1{suffix}"] = rows[f"plane_{name}_1"].to_numpy()
        out[f"ids2_8{suffix}"] = rows[[f"plane_{name}_{i}" for i in FAST]].sum(axis=1).to_numpy()
        out[f"ids9_free{suffix}"] = (rows[slow].sum(axis=1) + rows[f"free_{name}"]).to_numpy()
    return out


def plane_rows(pos: pd.DataFrame, length: int) -> list[dict]:
    """Per positional layer (and all of them, layer -1) the mean channel-group gaps of the wrong rows,
    with percentile intervals of the prompt bootstrap."""
    out = []
    for layer, group in [(-1, pos), *pos.groupby("layer")]:
        wrong = group[group.top_key != group.tracked_key]
        row = {"length": length, "layer": int(layer), "rows": len(wrong), "prompts": int(wrong.prompt.nunique())}
        if len(wrong) >= 2:
            prompts = wrong.prompt.to_numpy()
            order = np.unique(prompts)
            index = np.searchsorted(order, prompts)
            weights = bootstrap_weights(len(order), seed=SEED)  # [B, prompts]
            counts = np.bincount(index, minlength=len(order)).astype(np.float64)  # rows per prompt
            for name, values in channel_groups(wrong).items():
                sums = np.bincount(index, weights=values, minlength=len(order))
                boot = (weights @ sums) / np.maximum(weights @ counts, 1)  # [B] row means of resampled prompts
                lo, hi = percentile_interval(boot)
                row |= {name: float(values.mean()), f"{name}_lo": float(lo), f"{name}_hi": float(hi)}
        out.append(row)
    return out


def rotary_planes(model) -> int:
    """The RoPE planes of one head of a posym GPT-J model (frequency IDs 1 .. this)."""
    return gptj_rotary_dim(model.config) // 2


def parse_planes(spec: str, planes: int) -> list[int]:
    """Frequency IDs (1-based) from '1', '2,3' or '9-64'; a PosymError unless each is in 1 .. planes.

    >>> parse_planes("2,9-11", 64)
    [2, 9, 10, 11]
    """
    ids: set[int] = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise PosymError(f"--planes takes frequency IDs such as 1, 2,3 or 9-64, got {spec!r}") from None
        if not 1 <= first <= last <= planes:
            raise PosymError(f"--planes: frequency IDs run 1-{planes} in this model, got {part.strip()!r}")
        ids.update(range(first, last + 1))
    return sorted(ids)


def plane_tag(ids: list[int]) -> str:
    """The name of a plane set in the causal conditions and file names.

    >>> plane_tag([1]), plane_tag([9, 10, 11]), plane_tag([2, 5])
    ('id1', 'ids9_11', 'ids2_5')
    """
    if len(ids) == 1:
        return f"id{ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"ids{ids[0]}_{ids[-1]}"
    return "ids" + "_".join(map(str, ids))


def conditions(model, labels, reach: int, ids: list[int]):
    """(name, draw, context factory) of the causal check of frequency IDs `ids` (1-based; the model's planes
    are 0-based, so ID 1 is plane 0). The random-plane control draws len(ids) planes outside `ids` (none
    when fewer remain); with ids = [1] its draws are those of the committed tables."""
    tag, chosen = plane_tag(ids), [i - 1 for i in ids]
    positional = sorted(int(x) for x in labels.layer[labels.label == "positional"])
    others = sorted(set(range(model.config.n_layer)) - set(positional))
    rest = [m for m in range(rotary_planes(model)) if m not in chosen]
    rng = random.Random(SEED)
    out = [
        ("none", 0, None),
        (f"{tag}_far", 0, lambda: far_planes_removed(model, {(l, 0): chosen for l in positional}, reach)),
    ]
    for draw in range(DRAWS if len(rest) >= len(chosen) else 0):
        drawn = {(l, 0): rng.sample(rest, len(chosen)) for l in positional}
        out.append(("random_plane_far", draw, lambda c=drawn: far_planes_removed(model, c, reach)))
    for draw in range(DRAWS):
        layers = rng.sample(others, min(len(positional), len(others)))
        out.append(
            (
                f"{tag}_far_other_heads",
                draw,
                lambda ls=layers: far_planes_removed(model, {(l, 0): chosen for l in ls}, reach),
            )
        )
    out.append((f"{tag}_all_keys", 0, lambda: ablated_planes(model, {(l, 0): chosen for l in positional})))
    out.append((f"{tag}_mean_shift_far", 0, "shift"))  # built per length by `causal` (it needs the prompts)
    return out


def far_share(model, samples, layers: list[int], reach: int, n_prompts: int, planes=(0,)) -> dict[int, float]:
    """Per layer (head 0), the mean share of `planes` (0-based; default plane ID 1) in the logits of the keys
    more than `reach` back, at the chain pointers of the first `n_prompts` samples: what removing those
    planes from the far keys takes from them on average (float64, `posym.core.swaps.channel_logits`)."""
    planes = list(planes)
    part = samples[:n_prompts]
    queries, _ = chain_queries(part)
    sums = {layer: [0.0, 0] for layer in layers}

    def work(layer, qk, jobs):
        for p, rows in jobs.items():
            first = qk.first_key(p)
            count = p - reach - first  # keys first .. p - reach - 1 are the far ones
            if count > 0:
                share = channel_logits(qk, torch.tensor(rows), [0], p)[:, 0, planes, :count].sum(1)  # [G, far keys]
                sums[layer][0] += float(share.sum())
                sums[layer][1] += share.numel()

    for _ in scan(model, list(part.input_ids), queries, work, layers=layers):
        pass
    return {layer: total / count if count else 0.0 for layer, (total, count) in sums.items()}


def causal(model, base, labels, n: int, lengths, batch_tokens: int, ids=(1,)):
    rows = []
    reach = base.seq_len - 1  # the training prompts' longest query-key distance: 16 in the paper's 17 tokens
    positional = sorted(int(x) for x in labels.layer[labels.label == "positional"])
    shifts: list[dict] = []
    planes = [i - 1 for i in ids]
    for name, draw, make in conditions(model, labels, reach, list(ids)):
        for length in lengths:
            samples = generate(extension(base, length), n, SEED, split="test")
            batch = max(1, batch_tokens // length)
            if make is None:
                pred = predictions(model, samples, batch)
            elif make == "shift":  # the same average shift of the far keys as <tag>_far, on every far key alike
                shift = far_share(model, samples, positional, reach, SHIFT_PROMPTS, planes)
                with far_planes_removed(model, {}, reach, penalty={(layer, 0): s for layer, s in shift.items()}):
                    pred = predictions(model, samples, batch)
                shifts.extend({"length": length, "layer": layer, "shift": s} for layer, s in shift.items())
            else:
                with make():
                    pred = predictions(model, samples, batch)
            rows.append({"condition": name, "draw": draw, "length": length, **wilson_row(pred == samples.answer)})
        print(f"causal {name} {draw}: " + " ".join(f"{r['acc']:.2f}" for r in rows[-len(lengths) :]), flush=True)
    return pd.DataFrame(rows), pd.DataFrame(shifts)


QUOTE_LENGTHS = (17, 50, 52, 54, 56, 58, 60, 68, 128)
"""Lengths whose numbers docs/results.md quotes."""


def headline(out: Path) -> dict:
    """The numbers docs/results.md quotes, each recomputed from the committed tables (quoted.json)."""
    acc = pd.read_parquet(out / "accuracy.parquet")
    acc = acc[acc.hop == ALL_HOPS].set_index("length")
    heads = pd.read_parquet(out / "heads.parquet")
    alias = pd.read_parquet(out / "alias.parquet").set_index(["source", "length"])
    planes = pd.read_parquet(out / "planes.parquet")
    tops = pd.read_parquet(out / "top_keys.parquet")
    causal = pd.read_parquet(out / "interventions.parquet")
    summary = pd.read_json(out / "summary.json", typ="series")
    positional = [r["layer"] for r in summary["labels"] if r["label"] == "positional"]
    below = acc[acc.hi < 0.9]
    q: dict = {
        "step": int(summary["step"]),
        "reach": int(summary["reach"]),
        "positional_layers": positional,
        "named_offsets": [19, 25, 44],
        "alias_gaps": {str(d): r3(alias_gap(d)) for d in (19, 25, 44)},
        "interval": 95,
        "fast_alias_gaps": {  # planes ID 1-3 at the offsets the wrong keys take (and 44)
            str(d): [r3(alias_gap(d, ROPE_BASE ** (-(k - 1) / PLANES))) for k in (1, 2, 3)]
            for d in (44, 50, 51, 57, 58)
        },
        "lengths": [int(L) for L in summary["lengths"]],
        "head_lengths": [int(L) for L in summary["head_lengths"]],
        "causal_lengths": [int(L) for L in summary["causal_lengths"]],
        "draws": DRAWS,
        "channel_groups": [1, min(FAST), max(FAST), max(FAST) + 1],
        "near": 0.2,
        "n": int(acc.n.iloc[0]),
        "cliff_first_below_0p9": int(below.index.min()) if len(below) else None,
        "accuracy": {int(L): [r3(acc.acc[L]), r3(acc.lo[L]), r3(acc.hi[L])] for L in QUOTE_LENGTHS if L in acc.index},
    }
    pos = heads[heads.layer.isin(positional)].groupby("length")[["rows", "wrong"]].sum()
    q["positional_wrong_share"] = {int(L): r3(r.wrong / r.rows) for L, r in pos.iterrows()}
    base = heads[heads.layer.isin(positional) & (heads.length == int(summary["head_lengths"][0]))]
    q["base_right_rows"] = int((base.rows - base.wrong).sum())
    q["wrong_keys"] = {int(L): int(g.rows.sum()) for L, g in tops.groupby("length")}
    offsets = pd.read_parquet(out / "head_offsets.parquet")
    q["offsets"] = {
        int(L): {
            "most": [
                [int(d), int(c)]
                for d, c in g.sort_values(["observed", "offset"], ascending=[False, True])
                .head(4)[["offset", "observed"]]
                .values
            ],
            "at_44": int(g.observed[g.offset == 44].sum()),
            "expected_44": r3(g.expected[g.offset == 44].sum()),
        }
        for L, g in offsets.groupby("length")
    }
    q["alias_heads"] = {
        int(L): {k: (int(v) if k in ("wrong", "aliased") else r3(v)) for k, v in row.items()}
        for (source, L), row in alias.iterrows()
        if source == "positional heads" and row.wrong > 0
    }
    pooled = planes[(planes.layer == -1) & (planes.rows >= 2)].set_index("length")
    groups = ("total", "id1", "ids2_8", "ids9_free", "id1_others", "ids2_8_others", "ids9_free_others")
    q["planes"] = {
        int(L): {"rows": int(row.rows), **{g: [r3(row[g]), r3(row[f"{g}_lo"]), r3(row[f"{g}_hi"])] for g in groups}}
        for L, row in pooled.iterrows()
    }
    q |= causal_quotes(causal, pd.read_parquet(out / "shifts.parquet"), "id1")
    extra = {path.stem.removeprefix("interventions-"): path for path in sorted(out.glob("interventions-*.parquet"))}
    if extra:  # `--planes` other than 1
        q["causal_planes"] = {
            tag: causal_quotes(pd.read_parquet(path), pd.read_parquet(out / f"shifts-{tag}.parquet"), tag)
            for tag, path in extra.items()
        }
    return q


def causal_quotes(causal: pd.DataFrame, shifts: pd.DataFrame, tag: str) -> dict:
    """The causal check's quoted numbers: per condition and length the mean, min and max accuracy over the
    draws, the mean-shift control's penalties (min, max over layers) and Wilson intervals of the single
    conditions (no control, the planes removed from the far keys, from every key)."""
    lengths = sorted(causal.length.unique())
    mean = causal.groupby(["condition", "length"]).acc.agg(["mean", "min", "max"])
    single = ("none", f"{tag}_far", f"{tag}_all_keys")
    rows = causal[causal.condition.isin(single)].set_index(["condition", "length"])
    return {
        "causal": {
            c: {
                int(L): [r3(mean.loc[(c, L), "mean"]), r3(mean.loc[(c, L), "min"]), r3(mean.loc[(c, L), "max"])]
                for L in lengths
            }
            for c in causal.condition.unique()
        },
        "shifts": {int(L): [r3(g.min()), r3(g.max())] for L, g in shifts.groupby("length")["shift"]},
        "causal_wilson": {c: {int(L): [r3(rows.lo[(c, L)]), r3(rows.hi[(c, L)])] for L in lengths} for c in single},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a number-task posym run directory (read only)")
    parser.add_argument("--step", type=int, required=True, help="the checkpoint step")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--n", type=int, default=480, help="test questions per length (accuracy, causal check)")
    parser.add_argument("--head-prompts", type=int, default=128, help="test questions per length (head measures)")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--stages", default="accuracy,heads,causal")
    parser.add_argument("--smoke", action="store_true", help="two lengths per stage (a quick check of the script)")
    parser.add_argument(
        "--planes", default=DEFAULT_PLANES, help="frequency IDs of the causal check, e.g. 1 (default), 2 or 9-64"
    )
    args = parser.parse_args(argv)
    if args.stages == "summary":  # quoted.json from the tables already there, no model needed
        write_json(args.out / "quoted.json", headline(args.out))
        return 0
    model, info = load_checkpoint(args.run, step=args.step)
    base = info["task_config"]
    if base.task != "number" or base.extra_target:
        raise PosymError(f"{args.run} is not a number-task run at its training length")
    stages = set(args.stages.split(","))
    ids = parse_planes(args.planes, rotary_planes(model))
    suffix = "" if ids == [1] else f"-{plane_tag(ids)}"  # plane ID 1's tables keep their committed names
    start = time.time()
    labels = label_heads(model, base, n_prompts=LABEL_PROMPTS, seed=SEED, gamma=HEAD_GAMMA)
    labels = labels[labels["head"] == 0][["layer", "label", "s_pos", "s_sym"]].reset_index(drop=True)
    out = args.out
    lengths, head_lengths, causal_lengths = (
        ([17, 60], [17, 60], [17, 60]) if args.smoke else (LENGTHS, HEAD_LENGTHS, CAUSAL_LENGTHS)
    )
    if "accuracy" in stages:
        acc, answers = accuracy(model, base, args.n, lengths, args.batch_tokens)
        write_parquet(out / "accuracy.parquet", acc)
        write_parquet(out / "answer_offsets.parquet", answers)
    if "heads" in stages:
        heads, hist, planes, tops = head_tables(model, base, labels, args.head_prompts, head_lengths)
        write_parquet(out / "heads.parquet", heads)
        write_parquet(out / "top_keys.parquet", tops)
        write_parquet(out / "head_offsets.parquet", hist)
        write_parquet(out / "planes.parquet", planes)
    if "causal" in stages:
        interventions, shifts = causal(model, base, labels, args.n, causal_lengths, args.batch_tokens, ids)
        write_parquet(out / f"interventions{suffix}.parquet", interventions)
        write_parquet(out / f"shifts{suffix}.parquet", shifts)
    alias = []
    for name, source in (("head_offsets", "positional heads"), ("answer_offsets", "answers")):
        path = out / f"{name}.parquet"
        if path.is_file():
            for length, hist in pd.read_parquet(path).groupby("length"):
                alias.append({"length": int(length), "source": source, **alias_share(hist)})
    if alias:
        write_parquet(out / "alias.parquet", pd.DataFrame(alias))
    config = {"run": str(args.run), "step": args.step, "n": args.n, "head_prompts": args.head_prompts}
    write_json(
        out / "summary.json",
        {
            "run": str(args.run),
            "step": int(info["step"]),
            "reach": base.seq_len - 1,
            "labels": labels.to_dict("records"),
            "lengths": lengths,
            "head_lengths": head_lengths,
            "causal_lengths": causal_lengths,
            "stages": sorted(stages),
            "planes": ids,  # of this call's causal check
            "wall_s": round(time.time() - start, 1),  # of the stages this call ran
            "manifest": manifest(config, seed=SEED),
        },
    )
    if all((out / f"{name}.parquet").is_file() for name in ("accuracy", "heads", "interventions")):
        write_json(out / "quoted.json", headline(out))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PosymError as error:  # bad input: one line, exit 2, no traceback
        print(f"number_cliff: {error}", file=sys.stderr)
        sys.exit(2)
