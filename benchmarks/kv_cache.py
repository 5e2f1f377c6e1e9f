"""posym's head-aware KV cache (`posym.core.kvcache.HeadKVCache`) against the model's own full cache, in one
run: bytes held, peak memory and decode seconds per token (issue 53).

Model (--model): any spec posym loads (default smollm2-135m, the embedded SmolLM2-135M-Instruct), in
--dtype (fp32 default, bf16) on --device (cpu default). Text: the Python reference documentation shipped
with CPython (tests/real_llm.py's `real_text_ids`), cut to each length. Policy: `posym.core.kvpolicy`'s
--policy ranked from --table (a head table, as `posym kv-policy --table`), or without one a seeded uniform
draw of --streaming of the KV heads (--seed); --sink and --recent as DuoAttention's sink_size and
recent_size.

Per length, three runs of the same prompt, each a prefill then --new-tokens greedy decoding steps:
- `model`: the model's own kernel (SDPA) and its DynamicCache, the baseline;
- `full`: HeadKVCache under the 'full' policy in posym's kernel (the kernel's own cost, nothing streamed);
- `policy`: HeadKVCache under the policy.
Each records the bytes its cache holds at the end (keys and values: DynamicCache's tensors,
`kvcache.cache_bytes`), the peak memory rise over the prefill and the decoding (the resident set's
high-water mark after glibc's malloc_trim, as benchmarks/long_prompts.py measures), prefill seconds and
decode seconds per token, and its new tokens; `policy` also the kept-KV fraction the policy implies
(`KVPolicy.kept_fraction`) and `policy_bytes`, which its cache must hold exactly. Results go to --json
after each length (a run cut short keeps what it measured); every entry records the load average.

    OMP_WAIT_POLICY=PASSIVE nice python benchmarks/kv_cache.py --lengths 1024,4096,8192,16384 \
        --table runs/atlas/smollm2/atlas.parquet --json docs/benchmarks/kv_cache.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch starts its threads: set before the import
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests"), str(Path(__file__).resolve().parent)]

import numpy as np
import torch
from long_prompts import measure
from real_llm import real_text_ids
from record import benchmark_header

from posym import models
from posym.commands.kv_policy import read_head_table
from posym.core import kvcache, kvpolicy
from posym.io import write_json

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--lengths", default="1024,4096,16384", help="prompt lengths, comma-separated")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy decoding steps after each prompt")
    p.add_argument("--policy", default="posym", choices=[name for name in kvpolicy.POLICIES if name != "full"])
    p.add_argument("--table", default=None, help="head table the policy ranks (else a uniform random draw)")
    p.add_argument("--streaming", type=float, default=0.5, help="fraction of KV heads streaming")
    p.add_argument("--sink", type=int, default=kvpolicy.SINK)
    p.add_argument("--recent", type=int, default=kvpolicy.RECENT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, help="results file (written after each length)")
    return p


def build_policy(config, args) -> kvpolicy.KVPolicy:
    """--policy from --table, or a uniform seeded draw of --streaming of the KV heads without one."""
    if args.table is not None or args.policy == "streaming":
        table = read_head_table(args.table) if args.table is not None else None
        return kvpolicy.policy_from_table(
            args.policy, config, args.streaming, table=table, sink=args.sink, recent=args.recent, seed=args.seed
        )
    n_layers, n_heads, n_kv = kvpolicy.head_counts(config)
    keep = np.random.default_rng(args.seed).random((n_layers, n_kv))  # uniform: random keep scores
    windows = kvpolicy.layer_windows(config)
    return kvpolicy.choose(
        keep, args.streaming, sink=args.sink, recent=args.recent, windows=windows, n_heads=n_heads, name="uniform"
    )


@torch.no_grad()
def decode(model, ids: torch.Tensor, new_tokens: int, cache, policy=None) -> dict:
    """Prefill `ids` [1, T] then `new_tokens` greedy steps with `cache` (under policy_attention when
    `policy` is given): seconds, peak memory rise, bytes held, the new tokens."""

    def prefill():
        return model(ids, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)  # [1, 1]

    def steps(token):
        out = [token]
        for _ in range(new_tokens - 1):
            out.append(model(out[-1], cache=cache, use_cache=True).logits[:, -1:].argmax(-1))
        return torch.cat(out, dim=1)

    device = str(ids.device)
    if policy is None:
        prefill_s, prefill_peak, token = measure(prefill, device)
        decode_s, decode_peak, tokens = measure(lambda: steps(token), device)
        held = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    else:
        with kvcache.policy_attention(model, policy, cache=cache):
            prefill_s, prefill_peak, token = measure(prefill, device)
            decode_s, decode_peak, tokens = measure(lambda: steps(token), device)
        held = kvcache.cache_bytes(cache)
    return {
        "prefill_s": prefill_s,
        "decode_s_per_token": decode_s / max(1, new_tokens - 1),
        "prefill_peak_bytes": prefill_peak,
        "decode_peak_bytes": decode_peak,
        "cache_bytes": held,
        "tokens": tokens[0].tolist(),
        "load_average": list(os.getloadavg()),
    }


def run_length(model, ids: torch.Tensor, policy: kvpolicy.KVPolicy, new_tokens: int, dtype) -> dict:
    """The three runs of one prompt (module docstring)."""
    from transformers import DynamicCache

    length = ids.shape[1]
    full = kvpolicy.KVPolicy(np.ones_like(policy.full), policy.sink, policy.recent, policy.windows, policy.n_heads)
    entry = {"tokens": length, "new_tokens": new_tokens}
    entry["model"] = decode(model, ids, new_tokens, DynamicCache(config=model.config))
    entry["full"] = decode(model, ids, new_tokens, kvcache.HeadKVCache(model, full), full)
    entry["policy"] = decode(model, ids, new_tokens, kvcache.HeadKVCache(model, policy), policy)
    held = length + new_tokens - 1  # the last new token is never fed
    entry["policy"]["kept_fraction"] = policy.kept_fraction(held)
    entry["policy"]["policy_bytes"] = kvcache.policy_bytes(model, policy, held, batch=1, dtype=dtype)
    entry["full"]["policy_bytes"] = kvcache.full_cache_bytes(model, policy, held, batch=1, dtype=dtype)
    entry["memory_ratio"] = entry["policy"]["cache_bytes"] / entry["full"]["cache_bytes"]
    entry["decode_speedup"] = entry["full"]["decode_s_per_token"] / entry["policy"]["decode_s_per_token"]
    return entry


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    load_at_start = os.getloadavg()
    loaded = models.load(args.model, device=args.device, dtype=DTYPES[args.dtype])
    model, dtype = loaded.model, getattr(torch, DTYPES[args.dtype])
    policy = build_policy(model.config, args)
    lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    text = real_text_ids(loaded.tokenizer, max(lengths))
    result = {
        "model": args.model,
        "dtype": DTYPES[args.dtype],
        "device": args.device,
        "policy": policy.name,
        "table": args.table,
        "streaming_fraction": policy.streaming_fraction,
        "sink": policy.sink,
        "recent": policy.recent,
        "runs": [],
    }
    for length in lengths:
        start = time.perf_counter()
        ids = torch.tensor([text[:length]], device=args.device)
        result["runs"].append(run_length(model, ids, policy, args.new_tokens, dtype))
        done = result["runs"][-1]
        print(f"{length:,} tokens: {done['memory_ratio']:.3f} of the cache bytes, {time.perf_counter() - start:.0f} s")
        if args.json:
            write_json(args.json, {**benchmark_header(torch.get_num_threads(), load_at_start), **result})
    return result


if __name__ == "__main__":
    main()
