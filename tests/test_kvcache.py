"""posym.core.kvcache: the KV policy's attention against a slow per-head, per-query float64 reference on
tiny models of every family, against transformers' own sliding window, and the per-head cache: the same
logits and greedy tokens as the masked model, and the bytes it really holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_models import FAMILIES, KINDS, WINDOWED, random_prompts, tiny_model

from posym.core import kvcache
from posym.core.kvcache import HeadKVCache, cache_bytes, full_cache_bytes, generate, policy_attention, policy_bytes
from posym.core.kvpolicy import KVPolicy, head_counts, kept_keys, layer_windows
from posym.errors import PosymError

SINK, RECENT, WINDOW = 2, 3, 5
CASES = [(kind, None) for kind in KINDS + FAMILIES] + [(kind, WINDOW) for kind in WINDOWED]
IDS = [f"{kind}-w{window}" if window else kind for kind, window in CASES]


def mixed_policy(model, sink=SINK, recent=RECENT) -> KVPolicy:
    """KV head 0 of layer 0 full, every other KV head streaming (both kinds in one layer and a layer all
    streaming); one KV head per layer: layer 0 full, layer 1 streaming."""
    n_layers, n_heads, n_kv = head_counts(model.config)
    full = np.zeros((n_layers, n_kv), dtype=bool)
    full[0, 0] = True
    return KVPolicy(full, sink, recent, layer_windows(model.config), n_heads)


def run_logits(model, ids, policy=None):
    with torch.no_grad():
        if policy is None:
            return model(ids, use_cache=False).logits
        with policy_attention(model, policy):
            return model(ids, use_cache=False).logits


def reference(query, key, value, *, layer, policy, scaling, softcap):
    """[B, H, T, dv]: for each head and query, an explicit float64 softmax over the keys it may see,
    spelled out here: j <= p, inside the layer's window, and for a streaming KV head j < sink or
    p - j < recent. One pass from position 0: query row i is position S - T + i."""
    B, H, T, _ = query.shape
    S, n_kv = key.shape[-2], key.shape[1]
    window = policy.windows[layer]
    out = torch.zeros(B, H, T, value.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kv = h // (H // n_kv)
            full = bool(policy.full[layer, kv])
            for i in range(T):
                p = S - T + i
                keys = [
                    j
                    for j in range(S)
                    if j <= p
                    and (window is None or p - j < window)
                    and (full or j < policy.sink or p - j < policy.recent)
                ]
                logits = []
                for j in keys:
                    x = float(query[b, h, i].double() @ key[b, kv, j].double()) * scaling
                    logits.append(math.tanh(x / softcap) * softcap if softcap is not None else x)
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for j, w in zip(keys, weights):
                    out[b, h, i] += w / total * value[b, kv, j].double()
    return out


@pytest.mark.parametrize("kind,window", CASES, ids=IDS)
def test_policy_attention_matches_the_slow_reference(kind, window, monkeypatch):
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    calls = []
    real = kvcache.attend

    def spy(query, groups, mask, q_pos, **kwargs):
        out = real(query, groups, mask, q_pos, **kwargs)
        calls.append((query, groups, kwargs, out))
        return out

    monkeypatch.setattr(kvcache, "attend", spy)
    ids = torch.tensor(random_prompts([12, 12], seed=1))  # [2, 12]: past the window, the sinks and recent keys
    run_logits(model, ids, policy)
    assert len(calls) == policy.n_layers
    softcap = getattr(model.config, "attn_logit_softcapping", None)
    for layer, (query, groups, kwargs, out) in enumerate(calls):
        n_kv = policy.n_kv_heads
        key = torch.zeros(2, n_kv, 12, groups[0][1].shape[-1], dtype=query.dtype)
        value = torch.zeros(2, n_kv, 12, groups[0][2].shape[-1], dtype=query.dtype)
        for kv_heads, keys, values, k_pos, _ in groups:
            assert k_pos.tolist() == list(range(12))
            key[:, kv_heads], value[:, kv_heads] = keys, values
        expected = reference(query, key, value, layer=layer, policy=policy, scaling=kwargs["scaling"], softcap=softcap)
        torch.testing.assert_close(out, expected, atol=1e-9, rtol=0)


@pytest.mark.parametrize("kind,window", CASES, ids=IDS)
def test_full_policy_is_the_model(kind, window):
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    full = KVPolicy(np.ones_like(policy.full), SINK, RECENT, policy.windows, policy.n_heads)
    ids = torch.tensor(random_prompts([12], seed=2))
    # the model's eager kernel takes its softmax in float32: agreement to float32 rounding
    torch.testing.assert_close(run_logits(model, ids, full), run_logits(model, ids), atol=1e-5, rtol=0)
    # a recent window as long as the prompt streams nothing away
    wide = KVPolicy(np.zeros_like(policy.full), 0, 12, policy.windows, policy.n_heads)
    torch.testing.assert_close(run_logits(model, ids, wide), run_logits(model, ids, full), atol=1e-12, rtol=0)
    # and a short one does change the answer
    assert (run_logits(model, ids, policy) - run_logits(model, ids, full)).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "starcoder2"])
def test_streaming_without_sinks_is_transformers_sliding_window(kind):
    # every KV head streaming with no sink and recent = w: the model with its own sliding window of w
    plain, windowed = tiny_model(kind), tiny_model(kind, window=4)
    n_layers, n_heads, n_kv = head_counts(plain.config)
    policy = KVPolicy(np.zeros((n_layers, n_kv), bool), 0, 4, layer_windows(plain.config), n_heads)
    ids = torch.tensor(random_prompts([14], seed=3))
    torch.testing.assert_close(run_logits(plain, ids, policy), run_logits(windowed, ids), atol=1e-5, rtol=0)


def head_cache_logits(model, policy, chunks):
    """Logits of each pass [B, T, V] over the chunks [B, T_c] with a HeadKVCache, and the cache."""
    cache = HeadKVCache(model, policy)
    out = []
    with torch.no_grad(), policy_attention(model, policy, cache=cache):
        for chunk in chunks:
            out.append(model(chunk, cache=cache, use_cache=True).logits)
    return out, cache


@pytest.mark.parametrize("kind,window", CASES, ids=IDS)
def test_head_cache_equals_the_masked_model(kind, window):
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    ids = torch.tensor(random_prompts([20, 20], seed=4))  # [2, 20]
    chunks = [ids[:, :9], ids[:, 9:12], *ids[:, 12:].split(1, dim=1)]  # a prefill, a chunk, then one token a pass
    logits, cache = head_cache_logits(model, policy, chunks)
    masked = run_logits(model, ids, policy)  # one pass, no cache
    torch.testing.assert_close(torch.cat(logits, dim=1), masked, atol=1e-9, rtol=0)
    # it holds per KV head only what the next query sees: sink + recent - 1 streaming keys, w - 1 windowed
    config = getattr(model.config, "text_config", None) or model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kept = 0
    for layer, w in enumerate(policy.windows):
        for full in policy.full[layer]:
            sink, recent = (None, None) if full else (SINK, RECENT)
            kept += kept_keys(21, sink=sink, recent=recent, window=w) - 1
    assert cache_bytes(cache) == 2 * 2 * kept * head_dim * 8  # batch 2, K and V, float64
    assert cache_bytes(cache) == policy_bytes(model, policy, 20, batch=2, dtype=torch.float64)
    kept = policy.kept(20)  # [layers, kv_heads]
    for layer, held in enumerate(cache.layers):
        for kv_heads, keys, values, positions, _ in held.stored:
            assert keys.shape[-2] == values.shape[-2] == len(positions)
            assert all(kept[layer, kv] == len(positions) for kv in kv_heads.tolist())
    assert cache.get_seq_length() == 20


@pytest.mark.parametrize("kind,window", CASES, ids=IDS)
def test_greedy_generation_equals_the_masked_model(kind, window):
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    prompt = torch.tensor(random_prompts([10], seed=5))
    tokens, cache = generate(model, prompt, policy, 8)
    ids = prompt
    with torch.no_grad(), policy_attention(model, policy):
        for _ in range(8):
            ids = torch.cat([ids, model(ids, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
    assert tokens.tolist() == ids[:, 10:].tolist()
    assert cache_bytes(cache) < full_cache_bytes(model, policy, 17, batch=1, dtype=torch.float64)


@pytest.mark.parametrize("kind,window", [("llama", None), ("mistral", WINDOW), ("gemma3_text", WINDOW)])
def test_full_policy_cache_is_the_model_cache(kind, window):
    # under the 'full' policy the head cache holds what transformers' DynamicCache holds, byte for byte
    from transformers import DynamicCache

    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    full = KVPolicy(np.ones_like(policy.full), SINK, RECENT, policy.windows, policy.n_heads)
    ids = torch.tensor(random_prompts([15], seed=6))
    chunks = [ids[:, :12], ids[:, 12:13], ids[:, 13:]]
    logits, cache = head_cache_logits(model, full, chunks)
    dynamic = DynamicCache(config=model.config)
    with torch.no_grad():
        plain = [model(chunk, cache=dynamic, use_cache=True).logits for chunk in chunks]
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in dynamic.layers)
    assert cache_bytes(cache) == full_cache_bytes(model, full, 15, batch=1, dtype=torch.float64) == held
    torch.testing.assert_close(torch.cat(logits, 1), torch.cat(plain, 1), atol=1e-5, rtol=0)


def test_refusals():
    model = tiny_model("llama")
    policy = mixed_policy(model)
    ids = torch.tensor(random_prompts([6], seed=7))
    cache = HeadKVCache(model, policy)
    with pytest.raises(PosymError, match="only inside policy_attention"), torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    other = KVPolicy(policy.full, SINK, RECENT + 1, policy.windows, policy.n_heads)
    with pytest.raises(PosymError, match="another policy"), policy_attention(model, other, cache=cache):
        pass
    with pytest.raises(PosymError, match="heads"):
        HeadKVCache(model, KVPolicy(np.ones((2, 1), bool), SINK, RECENT, (None, None), 4))
    with pytest.raises(PosymError, match="windows"):
        HeadKVCache(model, KVPolicy(policy.full, SINK, RECENT, (8, None), 4))
    with pytest.raises(PosymError, match="new_tokens"):
        generate(model, ids, policy, 0)
    # a DynamicCache on a windowed model drops keys the policy cannot place
    from transformers import DynamicCache

    windowed = tiny_model("mistral", window=WINDOW)
    dynamic = DynamicCache(config=windowed.config)
    ids = torch.tensor(random_prompts([9], seed=8))
    with torch.no_grad(), policy_attention(windowed, mixed_policy(windowed)):
        windowed(ids[:, :8], cache=dynamic, use_cache=True)
        with pytest.raises(PosymError, match="dropped keys or the batch is padded"):
            windowed(ids[:, 8:], cache=dynamic, use_cache=True)
    # a left-padded batch: its position_ids are not the cache slots
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    positions = torch.tensor([[0, 0, 1, 2, 3, 4]])
    with torch.no_grad(), policy_attention(model, policy), pytest.raises(PosymError, match="padded"):
        model(ids[:, :6], attention_mask=mask, position_ids=positions, use_cache=False)
    # the patch is gone after the block: the model's own kernels run again
    torch.testing.assert_close(run_logits(model, ids), run_logits(model, ids))


@pytest.mark.parametrize("kind,window", [("llama", None), ("qwen2", WINDOW), ("gemma3_text", WINDOW), ("gptj", None)])
def test_sdpa_models_get_the_same_semantics(kind, window):
    # sdpa hands the kernel a bool mask (or none) where eager hands a float one: the same policy either way
    eager, sdpa = tiny_model(kind, window=window), tiny_model(kind, window=window)
    sdpa.set_attn_implementation("sdpa")
    policy = mixed_policy(eager)
    ids = torch.tensor(random_prompts([13, 13], seed=9))
    torch.testing.assert_close(run_logits(sdpa, ids, policy), run_logits(eager, ids, policy), atol=1e-12, rtol=0)
    chunks = [ids[:, :7], *ids[:, 7:].split(1, dim=1)]
    logits, _ = head_cache_logits(sdpa, policy, chunks)
    torch.testing.assert_close(torch.cat(logits, 1), run_logits(eager, ids, policy), atol=1e-9, rtol=0)


def test_a_pass_that_skips_the_cache_is_refused():
    model = tiny_model("llama")
    policy = mixed_policy(model)
    ids = torch.tensor(random_prompts([6], seed=10))
    cache = HeadKVCache(model, policy)
    with torch.no_grad(), policy_attention(model, policy, cache=cache):
        model(ids, cache=cache, use_cache=True)
        with pytest.raises(PosymError, match="without updating the HeadKVCache"):
            model(ids[:, -1:], use_cache=False)  # the layers would read the last pass's keys


def test_the_benchmark_measures_what_it_says():
    # benchmarks/kv_cache.py on a tiny model: bytes held as counted, the full head cache as big as DynamicCache
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "kv_cache.py"
    spec = importlib.util.spec_from_file_location("kv_cache_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = tiny_model("llama")
    args = bench.parser().parse_args(["--streaming", "0.75", "--sink", "2", "--recent", "4", "--seed", "1"])
    policy = bench.build_policy(model.config, args)
    assert policy.name == "uniform" and policy.streaming_fraction == 0.75 and (policy.sink, policy.recent) == (2, 4)
    ids = torch.tensor(random_prompts([40], seed=11))
    entry = bench.run_length(model, ids, policy, 4, torch.float64)
    assert entry["model"]["cache_bytes"] == entry["full"]["cache_bytes"] == entry["full"]["policy_bytes"]
    assert entry["policy"]["cache_bytes"] == entry["policy"]["policy_bytes"] < entry["full"]["cache_bytes"]
    assert entry["memory_ratio"] == pytest.approx(policy.kept_fraction(43)) == entry["policy"]["kept_fraction"]
    assert entry["model"]["tokens"] == entry["full"]["tokens"] and len(entry["policy"]["tokens"]) == 4
    for run in ("model", "full", "policy"):
        assert entry[run]["decode_s_per_token"] > 0 and entry[run]["prefill_s"] > 0


def test_committed_benchmark_reads_back():
    """docs/benchmarks/kv_cache.json (SmolLM2, 1,024-16,384 tokens) holds what docs/results.md says of it: the
    policy's cache holds exactly the bytes its policy implies, a kept fraction of 0.51-0.62; the full head cache
    is the model's size and generates the model's tokens; posym's kernel decodes slower than the model's at
    every length; the policy's tokens leave the model's within the first ten, sooner on longer prompts; its
    table rows are the JSON's numbers."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    record = json.loads((root / "docs" / "benchmarks" / "kv_cache.json").read_text())
    assert record["model"] == "smollm2-135m" and record["streaming_fraction"] == 0.5
    runs = {r["tokens"]: r for r in record["runs"]}
    assert sorted(runs) == [1024, 4096, 8192, 16384]
    page = (root / "docs" / "results.md").read_text()
    for tokens, r in runs.items():
        model, full, policy = r["model"], r["full"], r["policy"]
        assert model["cache_bytes"] == full["cache_bytes"] == full["policy_bytes"] > policy["cache_bytes"]
        assert policy["cache_bytes"] == policy["policy_bytes"]
        assert (
            r["memory_ratio"] == pytest.approx(policy["cache_bytes"] / full["cache_bytes"]) == policy["kept_fraction"]
        )
        assert model["tokens"] == full["tokens"] and len(policy["tokens"]) == r["new_tokens"] == 32
        mib = [run["cache_bytes"] / 2**20 for run in (model, policy)]
        row = (
            f"| {tokens:,} | {mib[0]:.1f} / {mib[1]:.1f} | {r['memory_ratio']:.2f} | "
            + " / ".join(f"{run['decode_s_per_token']:.3f}" for run in (model, full, policy))
            + " | "
            + " / ".join(f"{run['decode_peak_bytes'] / 2**20:.1f}" for run in (model, full, policy))
            + " |"
        )
        assert row in page, row
        assert model["decode_s_per_token"] < min(full["decode_s_per_token"], policy["decode_s_per_token"])
    ratios = [runs[t]["memory_ratio"] for t in sorted(runs)]
    assert 0.5 < ratios[-1] and ratios == sorted(ratios, reverse=True) and ratios[0] < 0.63
    diverged = [
        next(i for i, (a, b) in enumerate(zip(runs[t]["model"]["tokens"], runs[t]["policy"]["tokens"])) if a != b)
        for t in sorted(runs)
    ]
    assert max(diverged) < 10 and diverged == sorted(diverged, reverse=True), diverged


@pytest.mark.parametrize("kind,window", [("llama", None), ("gemma2", WINDOW)])
def test_query_blocks_change_nothing(kind, window, monkeypatch):
    # one query a block (the budget of a long prefill, scaled down) computes what one block does
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    ids = torch.tensor(random_prompts([11, 11], seed=12))
    whole = run_logits(model, ids, policy)
    monkeypatch.setattr(kvcache, "ATTEND_BYTES", 1)
    torch.testing.assert_close(run_logits(model, ids, policy), whole, atol=1e-13, rtol=0)
    logits, _ = head_cache_logits(model, policy, [ids[:, :6], ids[:, 6:]])
    torch.testing.assert_close(torch.cat(logits, 1), whole, atol=1e-9, rtol=0)


@pytest.mark.parametrize("kind,window", [("llama", None), ("gemma3_text", WINDOW)])
def test_transformers_generate_takes_the_head_cache(kind, window):
    # model.generate with a HeadKVCache inside policy_attention decodes what kvcache.generate does
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    ids = torch.tensor(random_prompts([10], seed=13))
    tokens, _ = generate(model, ids, policy, 6)
    cache = HeadKVCache(model, policy)
    with policy_attention(model, policy, cache=cache):
        out = model.generate(ids, cache=cache, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert out[:, 10:].tolist() == tokens.tolist()
    assert cache_bytes(cache) == policy_bytes(model, policy, 15, batch=1, dtype=torch.float64)


@pytest.mark.parametrize("kind,window", [("llama", None), ("gemma3_text", WINDOW)])
def test_a_pass_builds_each_mask_once(kind, window, monkeypatch):
    # every layer of a pass with the same window reads the masks its first layer built: one build per
    # (streaming flag, window) a pass, not one per layer; a second pass builds its own
    model = tiny_model(kind, window=window)
    policy = mixed_policy(model)
    builds = []
    real = kvcache._block_seen

    def spy(*args):
        builds.append(args[5:7])  # (streaming, window)
        return real(*args)

    monkeypatch.setattr(kvcache, "_block_seen", spy)
    ids = torch.tensor(random_prompts([12], seed=3))
    whole = run_logits(model, ids, policy)
    distinct = set()
    for layer in range(policy.n_layers):
        for streaming in (False, True):
            if (~policy.full[layer] if streaming else policy.full[layer]).any():  # the layer has that group
                distinct.add((streaming, policy.windows[layer]))
    assert policy.n_layers > 1 and sorted(builds, key=str) == sorted(distinct, key=str)
    run_logits(model, ids, policy)
    assert len(builds) == 2 * len(distinct)
    monkeypatch.setattr(kvcache, "ATTEND_BYTES", 1)  # nothing held: built per layer, the same logits
    torch.testing.assert_close(run_logits(model, ids, policy), whole, atol=1e-13, rtol=0)
