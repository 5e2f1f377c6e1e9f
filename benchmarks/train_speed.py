"""Steps/s of posym's training step against a plain Hugging Face GPT-J loop.

Both loops train the same freshly built model (same seed) on the same batches with the same AdamW,
schedule and clipping; the only difference is the loss. The plain loop does what a Hugging Face
user writes: append the answer token and call `model(ids, labels=labels)` with labels -100 except
at the answer, which runs lm_head and a cross-entropy over every position. posym's `train_step`
runs lm_head on the last hidden vector only. Timed blocks alternate between the two loops so that
load from other processes hits both alike.

    python benchmarks/train_speed.py [--preset quick] [--task number] [--steps 60] [--blocks 4]

Prints steps/s of each and the ratio posym / plain and writes them to --json with
date, machine, load average and versions.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from record import benchmark_header  # noqa: E402

from posym.core.model import build_model  # noqa: E402
from posym.commands.train import resolve_config  # noqa: E402
from posym.core.train import make_optimizer, optimizer_update, train_batch, train_step  # noqa: E402
from posym.io import write_json  # noqa: E402


def plain_step(model, optimizer, config, step, ids, answer):
    """The textbook Hugging Face loss (labels -100 everywhere but the appended answer, logits at
    every position); the update after it is posym's own, so only the loss differs between the loops."""
    full = torch.cat([ids, answer[:, None]], dim=1)  # [B, seq + 1]
    labels = torch.full_like(full, -100)
    labels[:, -1] = answer
    return optimizer_update(model, optimizer, config, step, model(input_ids=full, labels=labels).loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--task", default="number")
    parser.add_argument("--steps", type=int, default=60, help="steps per timed block")
    parser.add_argument("--blocks", type=int, default=4, help="timed blocks per loop (alternating)")
    parser.add_argument("--json", default="docs/benchmarks/train_speed.json", help="where the results go")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    config = resolve_config(args.preset, args.task, overrides={"device": "cpu"})
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    batches = [tuple(torch.as_tensor(a) for a in train_batch(config.task, s, config.batch_size, config.seed))
               for s in range(args.steps)]
    loops = {}
    for name, step_fn in (("posym", train_step), ("plain", plain_step)):
        model = build_model(config.model, config.task.vocab_size, config.seed)
        loops[name] = [model, make_optimizer(model, config), step_fn, 0.0]
    for name, (model, opt, step_fn, _) in loops.items():  # warm-up: first calls allocate
        for s, (ids, answer) in enumerate(batches[:5]):
            step_fn(model, opt, config, s, ids, answer)
    for _ in range(args.blocks):
        for name, loop in loops.items():
            model, opt, step_fn, _ = loop
            t0 = time.perf_counter()
            for s, (ids, answer) in enumerate(batches):
                step_fn(model, opt, config, s, ids, answer)
            loop[3] += time.perf_counter() - t0
    total = args.steps * args.blocks
    rate = {name: total / loop[3] for name, loop in loops.items()}
    write_json(args.json, {**benchmark_header(torch.get_num_threads(), load_at_start),
                           "benchmark": "benchmarks/train_speed.py", "settings": vars(args),
                           "batch_size": config.batch_size, "steps_each": total, "posym_steps_per_s": rate["posym"],
                           "plain_hf_steps_per_s": rate["plain"], "ratio": rate["posym"] / rate["plain"]})
    print(f"{args.preset}/{args.task}, batch {config.batch_size}, {torch.get_num_threads()} thread(s), "
          f"{total} steps each")
    print(f"posym {rate['posym']:.2f} steps/s   plain HF {rate['plain']:.2f} steps/s   "
          f"ratio {rate['posym'] / rate['plain']:.3f}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
