"""The letter model's length gap, measured causally (issue 56): which heads and which RoPE planes lose the answer.

lengthgen lengthens a question by E extra target-window tokens at positions 0 .. E - 1; the chain, the query and
every distance between them are unchanged, so with RoPE the only thing a longer prompt changes is the keys
that compete. This script runs the questions of the default letter model at long lengths under inference-time
interventions on those extra keys (one checkpoint, read only) and writes the accuracy of each, with Wilson
95% intervals over the questions:

- `none`: the model as it is; `hide_all`: the extra keys hidden from every head (`posym.core.interventions.
  keys_hidden`), which must give the training-length answers exactly (checked: `exact_max_abs` in summary.json,
  the largest answer-logit difference against the 17-token prompt);
- `hide_one` (per layer): the extra keys hidden from that head alone: how much of the gap that head's
  attention to them costs; `keep_one`: hidden from every head but that one: how much that head alone loses;
- `hide_top` k = 1, 2, 3: hidden from the k heads with the largest `hide_one` gain on a disjoint ranking set
  of questions (seed 1), against `random_heads` k: as many random heads (`--draws` draws; randomization p);
- `far_ids<a>_<b>`: RoPE frequency IDs a..b removed from every head's logits of keys farther than the training
  prompts' longest distance (16: `far_planes_removed`, the number cliff's check, the identity at 17 tokens),
  for the groups 1-8, 9-16, 17-32 and 33-64, against `random_planes` of the same size (`--draws` draws).

Writes into --out (default docs/results/letter-gap):

    interventions.parquet   seed, length, condition, k, draw, heads, planes, n, correct, acc, lo, hi
    ranking.parquet         seed, length, layer, the hide_one accuracy on the ranking questions
    summary.json            runs, lengths, n, draws, exactness of hide_all, labels, manifest

    python scripts/letter_gap.py RUN [RUN ...] [--lengths 512,850] [--n 480] [--draws 20] [--device cuda]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from number_cliff import rotary_planes, wilson_row  # noqa: E402

from posym.core.interventions import far_planes_removed, keys_hidden  # noqa: E402
from posym.core.lengthgen import extension  # noqa: E402
from posym.core.tasks import generate  # noqa: E402
from posym.core.train import answer_logits  # noqa: E402
from posym.io import manifest, write_json, write_parquet  # noqa: E402
from posym.models import load_checkpoint  # noqa: E402

OUT = ROOT / "docs" / "results" / "letter-gap"
PLANE_GROUPS = ((1, 8), (9, 16), (17, 32), (33, 64))
"""Frequency-ID groups removed from the far keys (1-8: the fast planes of the number cliff's check)."""
TOP = (1, 2, 3)
"""Sizes of the ranked head sets compared with random head sets."""
SEED, RANK_SEED = 0, 1
"""Test questions (lengthgen's) and the disjoint ranking questions; SEED also seeds the random draws."""


def logits_of(model, samples, batch: int) -> torch.Tensor:
    return torch.cat([logits.float().cpu() for logits, _ in answer_logits(model, samples, batch)])  # [n, vocab]


def run_conditions(model, base, length: int, n: int, draws: int, batch_tokens: int, seed_label: int):
    extra = length - base.seq_len
    layers = model.config.n_layer
    heads = [(layer, 0) for layer in range(layers)]
    batch = max(1, batch_tokens // length)
    samples = generate(extension(base, length), n, SEED, split="test")
    rank = generate(extension(base, length), max(32, n // 2), RANK_SEED, split="test")
    rows = []

    def measure(name, k, draw, chosen_heads, planes, context, on=samples):
        if context is None:
            logits = logits_of(model, on, batch)
        else:
            with context:
                logits = logits_of(model, on, batch)
        correct = logits.argmax(-1).numpy() == on.answer
        row = {
            "seed": seed_label,
            "length": length,
            "condition": name,
            "k": k,
            "draw": draw,
            "heads": ",".join(f"L{layer}" for layer, _ in chosen_heads),
            "planes": planes,
            **wilson_row(correct),
        }
        return row, logits

    row, _ = measure("none", 0, 0, [], "", None)
    rows.append(row)
    row, hidden = measure("hide_all", layers, 0, heads, "", keys_hidden(model, heads, extra))
    rows.append(row)
    short = logits_of(model, generate(extension(base, base.seq_len), n, SEED, split="test"), batch)
    exact = float((hidden - short).abs().max())
    for layer in range(layers):
        rows.append(measure("hide_one", 1, 0, [(layer, 0)], "", keys_hidden(model, [(layer, 0)], extra))[0])
        others = [h for h in heads if h[0] != layer]
        rows.append(measure("keep_one", layers - 1, 0, others, "", keys_hidden(model, others, extra))[0])
    ranking = []
    for layer in range(layers):
        r, _ = measure("rank", 1, 0, [(layer, 0)], "", keys_hidden(model, [(layer, 0)], extra), on=rank)
        ranking.append({"seed": seed_label, "length": length, "layer": layer, "acc": r["acc"]})
    order = [int(r["layer"]) for r in sorted(ranking, key=lambda r: (-r["acc"], r["layer"]))]
    rng = random.Random(SEED)
    for k in TOP:
        chosen = [(layer, 0) for layer in sorted(order[:k])]
        rows.append(measure("hide_top", k, 0, chosen, "", keys_hidden(model, chosen, extra))[0])
        for draw in range(draws):
            drawn = [(layer, 0) for layer in sorted(rng.sample(range(layers), k))]
            rows.append(measure("random_heads", k, draw, drawn, "", keys_hidden(model, drawn, extra))[0])
    reach = base.seq_len - 1
    planes = rotary_planes(model)
    for lo, hi in PLANE_GROUPS:
        if hi > planes:
            continue
        chosen = list(range(lo - 1, hi))  # 0-based planes of IDs lo..hi
        tag = f"ids{lo}-{hi}"
        rows.append(
            measure(
                f"far_ids{lo}_{hi}",
                len(chosen),
                0,
                heads,
                tag,
                far_planes_removed(model, {h: chosen for h in heads}, reach),
            )[0]
        )
        rest = [m for m in range(planes) if m not in chosen]
        for draw in range(draws if len(rest) >= len(chosen) else 0):
            drawn = sorted(rng.sample(rest, len(chosen)))
            rows.append(
                measure(
                    f"random_planes_{lo}_{hi}",
                    len(chosen),
                    draw,
                    heads,
                    ",".join(str(m + 1) for m in drawn),
                    far_planes_removed(model, {h: drawn for h in heads}, reach),
                )[0]
            )
        print(f"seed {seed_label} length {length}: planes {tag} done", flush=True)
    frame = pd.DataFrame(rows)
    summary = frame.groupby(["condition", "k"]).acc.mean().round(3)
    print(f"seed {seed_label} length {length} (exact {exact:.2e}):\n{summary.to_string()}", flush=True)
    return frame, pd.DataFrame(ranking), exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="letter-task run directories (their last checkpoint)")
    parser.add_argument("--lengths", default="512,850")
    parser.add_argument("--n", type=int, default=480)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--batch-tokens", type=int, default=2**17)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    frames, rankings, exactness, sources = [], [], [], []
    for run in args.runs:
        model, info = load_checkpoint(run, device=args.device)
        base = info["task_config"]
        seed = int(yaml.safe_load((Path(info["run_dir"]) / "config.yaml").read_text())["seed"])
        sources.append({"run": str(run), "step": int(info["step"]), "seed": seed})
        for length in [int(x) for x in args.lengths.split(",")]:
            frame, ranking, exact = run_conditions(model, base, length, args.n, args.draws, args.batch_tokens, seed)
            frames.append(frame)
            rankings.append(ranking)
            exactness.append({"seed": seed, "length": length, "exact_max_abs": exact})
    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / "interventions.parquet", pd.concat(frames, ignore_index=True))
    write_parquet(args.out / "ranking.parquet", pd.concat(rankings, ignore_index=True))
    write_json(
        args.out / "summary.json",
        {
            "runs": sources,
            "lengths": args.lengths,
            "n": args.n,
            "draws": args.draws,
            "exactness": exactness,
            "manifest": manifest(
                vars(args) | {"runs": [str(r) for r in args.runs], "out": str(args.out)},
                seed=SEED,
                seeds={"questions": SEED, "ranking": RANK_SEED, "draws": SEED},
            ),
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
