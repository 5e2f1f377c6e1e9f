"""Where the length-generalization questions go wrong: attention given to the extra target tokens.

The paper's protocol (docs/method.md section 6) lengthens a question by E extra target-window tokens placed before the
effective window; the chain, the query and every distance between them are unchanged, and the
letter task's extra tokens carry non-hop letters, so no lookup gains a second match. With RoPE's
relative positions, the only thing that changes with the length is how many keys compete: a wrong
answer at 850 tokens has to come from attention leaking onto the extra tokens. This script measures
that leak on a trained run: per layer, at the query token and at every pointer token of the chain
(the hop queries), the softmax mass (from the model's own logits, float64) that lands on the E extra
tokens, and whether the question was answered right, by length.

    python scripts/extra_token_attention.py RUNS [--task letter] [--lengths 68,256,850] [--n 128]

Measures every finished paper-preset run of the task under RUNS (the layout of scripts/paper_seeds.sh, at
its last checkpoint, on the first n test questions) and writes one row per (run, length, layer, query
role, hop count, correct) with the mean extra-token mass and the number of (question, query) pairs to
docs/results/paper/extra_token_attention.parquet (--out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from collect_paper_results import runs  # noqa: E402

from posym.core.lengthgen import extension  # noqa: E402
from posym.core.swaps import clean_logits, scan  # noqa: E402
from posym.core.tasks import generate  # noqa: E402
from posym.core.train import answer_logits  # noqa: E402
from posym.io import write_parquet  # noqa: E402
from posym.models import load_checkpoint  # noqa: E402


def extra_mass(model, samples, extra: int) -> pd.DataFrame:
    """Per (question, query, layer): softmax mass on keys 0..extra-1 at the query (`last`) and at each
    pointer of its chain (`pointer`), one head per layer averaged."""
    chains = samples.chain  # [n, H+1] positions: query, pointers..., answer; -1 past the chain
    queries = [sorted({int(p) for p in row[:-1] if p >= 0}) for row in chains]
    last = [int(row[0]) for row in chains]

    def work(layer, qk, jobs):
        found = []
        heads = list(range(qk.q.shape[1]))
        for p, rows in jobs.items():
            weights = torch.softmax(clean_logits(qk, torch.tensor(rows), heads, p), dim=-1)  # [G, H, p+1]
            mass = weights[..., :extra].sum(-1).mean(-1).tolist()  # [G], heads averaged
            found += [(row, p, layer, m) for row, m in zip(rows, mass)]
        return found

    records = []
    for batch, results in scan(model, list(samples.input_ids), queries, work):
        for found in results:
            records += [
                {
                    "question": batch[row],
                    "query": p,
                    "layer": layer,
                    "mass": m,
                    "role": "last" if p == last[batch[row]] else "pointer",
                }
                for row, p, layer, m in found
            ]
    return pd.DataFrame(records)


def answered(model, samples, batch_size: int = 64):
    """[n] bool: the model's next token after each question is its answer."""
    return np.concatenate(
        [(logits.argmax(-1) == answer).cpu().numpy() for logits, answer in answer_logits(model, samples, batch_size)]
    )


def measure(run: Path, lengths: list[int], n: int) -> pd.DataFrame:
    """The table of one run: per (length, layer, role, hop count, correct) the mean extra-token mass."""
    model, info = load_checkpoint(run)
    task = info["task_config"]
    frames = []
    for length in lengths:
        extra = length - task.seq_len
        samples = generate(extension(task, length), n, 0, "test")
        correct = answered(model, samples)  # [n] bool
        print(f"{run}: length {length}, accuracy {correct.mean():.3f}")
        mass = extra_mass(model, samples, extra)
        mass["correct"] = correct[mass.question.to_numpy()]
        mass["hops"] = samples.hops[mass.question.to_numpy()]
        frames.append(
            mass.groupby(["layer", "role", "hops", "correct"], as_index=False)
            .agg(mass=("mass", "mean"), pairs=("mass", "size"))
            .assign(length=length, extra=extra, accuracy=float(correct.mean()), step=info["step"])
        )
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the RUNS directory of scripts/paper_seeds.sh")
    parser.add_argument("--task", default="letter")
    parser.add_argument("--lengths", default="68,256,850")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "results" / "paper" / "extra_token_attention.parquet"
    )
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    frames = [
        measure(run, lengths, args.n).assign(**keys)
        for keys, run in runs(args.runs)
        if keys["preset"] == "paper" and keys["task"] == args.task
    ]
    if not frames:
        sys.exit(f"no finished paper-preset {args.task} run under {args.runs}")
    table = pd.concat(frames, ignore_index=True)
    table = table[["preset", "seed", "task", *[c for c in table.columns if c not in ("preset", "seed", "task")]]]
    write_parquet(args.out, table)
    last = table[table.role == "last"]
    print(last.pivot_table(index=["seed", "length", "layer"], columns="correct", values="mass").round(3))


if __name__ == "__main__":
    main()
