"""Steps/s of posym's training step against a plain Hugging Face GPT-J loop.

Both loops train the same freshly built model (same seed) on the same batches with the same AdamW,
schedule and clipping; the only difference is the loss. The plain loop does what a Hugging Face
user writes: append the answer token and call `model(ids, labels=labels)` with labels -100 except
at the answer, which runs lm_head and a cross-entropy over every position. posym's `train_step`
runs lm_head on the last hidden vector only. Timed blocks alternate between the two loops so that
load from other processes hits both alike.

    python benchmarks/train_speed.py [--preset quick] [--task number] [--steps 60] [--blocks 4]

Prints steps/s of each and the ratio posym / plain and writes them to --json with date, machine, load
average and versions (default docs/benchmarks/train_speed.json, or train_speed_bf16.json).

With --compare bf16 the two loops are posym's step in fp32 and with precision bf16 (forward and
loss under bfloat16 autocast; posym.core.train.train_step), same model, batches and alternation; it
prints the ratio bf16 / fp32 (> 1: bf16 is faster here). `--device cuda` times on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    parser.add_argument(
        "--compare",
        choices=("plain", "bf16"),
        default="plain",
        help="plain: posym vs a plain HF loop; bf16: posym fp32 vs posym bf16 autocast",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the preset's)")
    parser.add_argument("--json", help="where the results go (default docs/benchmarks/train_speed[_bf16].json)")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    overrides = {"device": args.device, **({"threads": args.threads} if args.threads else {})}
    config = resolve_config(args.preset, args.task, overrides=overrides)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    batches = [
        tuple(torch.as_tensor(a).to(args.device) for a in train_batch(config.task, s, config.batch_size, config.seed))
        for s in range(args.steps)
    ]
    if args.compare == "plain":
        contenders = (("posym", train_step, config), ("plain", plain_step, config))
    else:
        contenders = (
            ("fp32", train_step, config),
            ("bf16", train_step, dataclasses.replace(config, precision="bfloat16")),
        )
    loops = {}
    for name, step_fn, cfg in contenders:
        model = build_model(cfg.model, cfg.task.vocab_size, cfg.seed).to(args.device)
        loops[name] = [model, make_optimizer(model, cfg), step_fn, cfg, 0.0]
    for name, (model, opt, step_fn, cfg, _) in loops.items():  # warm-up: first calls allocate
        for s, (ids, answer) in enumerate(batches[:5]):
            step_fn(model, opt, cfg, s, ids, answer)
    for _ in range(args.blocks):
        for name, loop in loops.items():
            model, opt, step_fn, cfg, _ = loop
            _sync(args.device)
            t0 = time.perf_counter()
            for s, (ids, answer) in enumerate(batches):
                step_fn(model, opt, cfg, s, ids, answer)
            _sync(args.device)
            loop[4] += time.perf_counter() - t0
    total = args.steps * args.blocks
    rate = {name: total / loop[4] for name, loop in loops.items()}
    (a, _, _), (b, _, _) = contenders
    ratio = rate[a] / rate[b] if args.compare == "plain" else rate[b] / rate[a]
    path = args.json or f"docs/benchmarks/train_speed{'' if args.compare == 'plain' else '_bf16'}.json"
    write_json(
        path,
        {
            **benchmark_header(torch.get_num_threads(), load_at_start),
            "benchmark": "benchmarks/train_speed.py",
            "settings": vars(args),
            "batch_size": config.batch_size,
            "steps_each": total,
            **{f"{name}_steps_per_s": r for name, r in rate.items()},
            ("ratio" if args.compare == "plain" else "ratio_bf16_over_fp32"): ratio,
        },
    )
    print(
        f"{args.preset}/{args.task}, batch {config.batch_size}, {args.device}, {torch.get_num_threads()} thread(s), "
        f"{total} steps each"
    )
    print(
        f"{a} {rate[a]:.2f} steps/s   {b} {rate[b]:.2f} steps/s   "
        + (f"ratio posym / plain {ratio:.3f}" if args.compare == "plain" else f"ratio bf16 / fp32 {ratio:.3f}")
    )
    print(f"wrote {path}")


def _sync(device: str) -> None:
    """Wait for queued GPU work, so that a block's time is its own."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
