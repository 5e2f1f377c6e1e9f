"""Interventions: RoPE variants (posym.core.rope), head ablation/pruning and frozen fine-tuning.

References: RoPE variants against attention recomputed from the weights with the rotation angles
written out; ablation hooks against the folded (saved) weights and head means against A @ V; a
hand-made GPT-J with one positional and one symbolic head; frozen weights compared bit for bit.
"""

import json
import math

import numpy as np
import pytest
import torch
from tiny_runs import train_tiny

from posym.configs import from_dict, to_dict
from posym.core.interventions import (
    HeadFreezer,
    ablated,
    ablated_planes,
    far_planes_removed,
    keys_hidden,
    fold_ablation,
    head_means,
    parse_heads,
    select_heads,
)
from posym.core.model import ModelConfig, build_model
from posym.core.qk import pair_planes, plane_dims
from posym.core.rope import layer_bands
from posym.errors import PosymError
from posym.models import load_checkpoint


def _config(**kw):
    base = dict(n_layer=2, n_head=2, n_embd=16, rotary_dim=8, dropout=0.0, activation="gelu")
    return from_dict(ModelConfig, {**base, **kw})


def _reference_attention(model, config, ids, layer):
    """Layer `layer`'s attention probabilities [batch, heads, T, T] from its weights, with the RoPE
    variant's angles computed here: plane k rotates by pos * base^(-2(k-1)/r) inside the band, else 0."""
    hidden = model(ids, output_hidden_states=True).hidden_states[layer]  # [B, T, E] entering the layer
    attn = model.transformer.h[layer].attn
    x = model.transformer.h[layer].ln_1(hidden).double()
    B, T, _ = x.shape
    H, d, r = config.n_head, config.head_dim, config.resolved_rotary_dim
    q = (x @ attn.q_proj.weight.double().T).view(B, T, H, d)
    k = (x @ attn.k_proj.weight.double().T).view(B, T, H, d)
    band = layer_bands(config)[layer]
    for tensor in (q, k):
        for plane in range(r // 2):
            fid = plane + 1
            on = band is not None and band[0] <= fid <= band[1]
            freq = config.rope_base ** (-2.0 * plane / r) if on else 0.0
            for pos in range(T):
                a = pos * freq
                x0, x1 = tensor[:, pos, :, 2 * plane].clone(), tensor[:, pos, :, 2 * plane + 1].clone()
                tensor[:, pos, :, 2 * plane] = x0 * math.cos(a) - x1 * math.sin(a)
                tensor[:, pos, :, 2 * plane + 1] = x1 * math.cos(a) + x0 * math.sin(a)
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)  # [B, H, T, T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return logits.masked_fill(~mask, -math.inf).softmax(-1)


@pytest.mark.parametrize(
    "variant",
    [
        dict(rope_bands=[[2, 3]]),
        dict(rope_bands=[[1, 1], [3, 4]], rope_base=500.0),
        dict(nope_from=1),
        dict(nope_from=0, rope_base=1e6),
        dict(),
    ],
)
def test_rope_variant_matches_reference_attention(variant):
    config = _config(**variant)
    model = build_model(config, 20, seed=1, attn_implementation="eager").eval()
    ids = torch.randint(1, 20, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids, output_attentions=True).attentions
        for layer in range(config.n_layer):
            ref = _reference_attention(model, config, ids, layer)
            torch.testing.assert_close(got[layer].double(), ref, atol=2e-6, rtol=0)


def test_band_restricted_model_has_zero_rotation_outside_its_band():
    from posym.core.qk import head_qk

    config = _config(rope_bands=[[2, 3], [4, 4], [1, 4]], n_layer=3, nope_from=2)
    model = build_model(config, 20, seed=0).eval()
    tables = head_qk(model, torch.arange(1, 13)[None])  # GPT-J's sin/cos, interleaved per plane
    for layer, band in enumerate([(2, 3), (4, 4), None]):
        sin, cos = tables[layer].sin[0, :, ::2], tables[layer].cos[0, :, ::2]  # [T, planes]
        inside = torch.zeros(4, dtype=torch.bool)
        if band:
            inside[band[0] - 1 : band[1]] = True
        assert torch.equal(sin[:, ~inside], torch.zeros_like(sin[:, ~inside]))
        assert torch.equal(cos[:, ~inside], torch.ones_like(cos[:, ~inside]))
        assert (sin[1:, inside].abs() > 1e-4).all()  # the band really rotates


def test_variant_is_restored_by_load_model_and_ignored_by_plain_transformers(tmp_path):
    from transformers import GPTJForCausalLM

    from posym.core.tasks import task_config

    config = _config(rope_bands=[[1, 2]], nope_from=1)
    model = build_model(config, 137, seed=0).eval()
    model.save_pretrained(tmp_path)
    (tmp_path / "posym.json").write_text(
        json.dumps({"step": 0, "task": to_dict(task_config("number")), "model": to_dict(config)})
    )
    ids = torch.arange(1, 18)[None]
    with torch.no_grad():
        want = model(ids).logits
        mine = load_checkpoint(tmp_path)[0](ids).logits
        plain = GPTJForCausalLM.from_pretrained(tmp_path).eval()(ids).logits
    torch.testing.assert_close(mine, want, atol=1e-6, rtol=0)
    assert (plain - want).abs().max() > 50 * (mine - want).abs().max() + 5e-5  # init weights are small


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(rope_bands=[[0, 2]]), r"1 <= first <= last <= 4, got \[0, 2\]"),
        (dict(rope_bands=[[3, 2]]), r"1 <= first <= last <= 4, got \[3, 2\]"),
        (dict(rope_bands=[[1, 5]]), r"1 <= first <= last <= 4, got \[1, 5\]"),
        (dict(rope_bands=[[1, 2], [1, 2], [1, 2]]), r"1 band \(every layer\) or 2 \(one per layer\), got 3"),
        (dict(nope_from=3), r"nope_from must be a layer index in 0\.\.2, got 3"),
        (dict(rope_base=1.0), r"rope_base must be a number > 1, got 1\.0"),
    ],
)
def test_bad_rope_variants_are_errors(bad, message):
    with pytest.raises(PosymError, match=message):
        _config(**bad)


# ---- a hand-made positional head (previous token) and symbolic head (find the partner token) --------

V, BETA = 8, 12.0


def _handmade():
    """1 layer, 2 heads, width 32, 4 rotary planes per head. Head 0: keys all equal (from the constant
    coordinate the LayerNorm bias provides), query rotated back by one step of plane 1 (theta = 1 rad):
    attends to position n - 1, copies its token into residual dims 16..23. Head 1 (unrotated dims):
    attends to the token t ^ 1 of the query token t, copies it into dims 24..31."""
    config = from_dict(ModelConfig, dict(n_layer=1, n_head=2, n_embd=32, rotary_dim=8, dropout=0.0, activation="gelu"))
    model = build_model(config, V, seed=0, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:V, :V] = torch.eye(V)
        block = model.transformer.h[0]
        block.ln_1.weight[:V] = 1.0
        block.ln_1.bias[8] = 1.0  # constant coordinate
        model.transformer.ln_f.weight.fill_(1.0)
        attn = block.attn
        attn.k_proj.weight[0, 8] = BETA
        attn.q_proj.weight[0, 8] = BETA * math.cos(1.0)
        attn.q_proj.weight[1, 8] = -BETA * math.sin(1.0)
        for i in range(V):
            attn.v_proj.weight[i, i] = 1.0
            attn.out_proj.weight[16 + i, i] = 1.0
            attn.k_proj.weight[24 + i, i] = BETA
            attn.q_proj.weight[24 + (i ^ 1), i] = BETA
            attn.v_proj.weight[16 + i, i] = 1.0
            attn.out_proj.weight[24 + i, 16 + i] = 1.0
    return model


def _prompts(n=64, length=6):
    rng = np.random.default_rng(0)
    out = []
    while len(out) < n:
        ids = rng.permutation(V)[:length]
        if ids[-1] ^ 1 in ids[:-1]:
            out.append(ids)
    return torch.as_tensor(np.stack(out))


def _lookups(model, ids):
    """(positional answers, symbolic answers) read from the two copy slots at the last position."""
    with torch.no_grad():
        hidden = model.transformer(input_ids=ids).last_hidden_state[:, -1]  # [n, 32]
    return hidden[:, 16:24].argmax(-1), hidden[:, 24:32].argmax(-1)


def test_handmade_heads_are_labelled_and_ablation_breaks_only_their_lookup():
    from posym.core.scores import score_model, summarize_heads

    model, ids = _handmade(), _prompts()
    labels = summarize_heads(score_model(model, ids, "last"))
    assert labels["label"].tolist() == ["positional", "symbolic"]
    assert select_heads("positional", model, labels) == [(0, 0)]
    assert select_heads("symbolic", model, labels) == [(0, 1)]
    prev, partner = ids[:, -2], ids[:, -1] ^ 1
    pos, sym = _lookups(model, ids)
    assert torch.equal(pos, prev) and torch.equal(sym, partner)
    means = head_means(model, ids, [(0, 0), (0, 1)])
    for mode in ("zero", "mean"):
        with ablated(model, [(0, 0)], mode, means):
            pos, sym = _lookups(model, ids)
        assert (pos == prev).float().mean() < 0.3 and torch.equal(sym, partner)
        with ablated(model, [(0, 1)], mode, means):
            pos, sym = _lookups(model, ids)
        assert torch.equal(pos, prev) and (sym == partner).float().mean() < 0.3


# ---- ablation maths ----------------------------------------------------------------------------


def test_head_means_equal_attention_times_values():
    config = _config()
    model = build_model(config, 20, seed=3, attn_implementation="eager").eval()
    ids = torch.randint(1, 20, (5, 9), generator=torch.Generator().manual_seed(1))
    heads = [(0, 0), (0, 1), (1, 1)]
    got = head_means(model, ids, heads, batch_size=2)
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
        for layer, h in heads:
            block = model.transformer.h[layer]
            x = block.ln_1(out.hidden_states[layer])  # [B, T, E]
            v = block.attn.v_proj(x).view(5, 9, 2, 8)[:, :, h]  # [B, T, d]
            per_pos = out.attentions[layer][:, h] @ v  # [B, T, d]
            torch.testing.assert_close(got[(layer, h)], per_pos.mean((0, 1)), atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_folded_ablation_equals_hooked_ablation_and_loads_in_plain_transformers(mode, tmp_path):
    from transformers import GPTJForCausalLM

    model = build_model(_config(), 20, seed=4).eval()
    ids = torch.randint(1, 20, (4, 10), generator=torch.Generator().manual_seed(2))
    heads = [(0, 1), (1, 0)]
    means = head_means(model, torch.randint(1, 20, (16, 10), generator=torch.Generator().manual_seed(3)), heads)
    with torch.no_grad():
        intact = model(ids).logits
        with ablated(model, heads, mode, means):
            hooked = model(ids).logits
        fold_ablation(model, heads, mode, means)
        folded = model(ids).logits
        model.save_pretrained(tmp_path)
        plain = GPTJForCausalLM.from_pretrained(tmp_path).eval()(ids).logits
    assert (hooked - intact).abs().max() > 1e-3  # the ablation does something
    torch.testing.assert_close(folded, hooked, atol=1e-5, rtol=0)
    torch.testing.assert_close(plain, folded, atol=1e-6, rtol=0)


def test_parse_heads():
    assert parse_heads("3.1, 0, 3.1", 4, 2) == [(0, 0), (0, 1), (3, 1)]
    for bad, message in [
        ("4", r"layer 4 does not exist \(layers 0\.\.3\)"),
        ("1.2", r"head 2 does not exist \(heads 0\.\.1\)"),
        ("x", "is not LAYER or LAYER.HEAD"),
        ("1.", "is not LAYER or LAYER.HEAD"),
        ("", "head '' is not LAYER or LAYER.HEAD"),
    ]:
        with pytest.raises(PosymError, match=message):
            parse_heads(bad, 4, 2)


# ---- freezing ------------------------------------------------------------------------------------


def _tiny_run(tmp_path):
    return train_tiny(
        tmp_path,
        "number",
        steps=4,
        every=4,
        batch_size=8,
        eval_size=50,
        weight_decay=0.1,
        model={"n_head": 2, "n_embd": 16},
    )


def test_frozen_heads_stay_bit_identical_and_the_rest_trains(tmp_path):
    from posym import io
    from posym.commands.finetune import finetune
    from posym.configs import override
    from posym.core.train import TrainConfig

    run = _tiny_run(tmp_path)
    cfg = override(from_dict(TrainConfig, io.read_yaml(run / "config.yaml")), {"lr": 1e-2})
    for restore in (True, False):
        model, info = load_checkpoint(run)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        if not restore:  # without the copy-back, weight decay alone moves the frozen weights
            HeadFreezer.restore, saved = (lambda self: None), HeadFreezer.restore
        try:
            cost = finetune(model, info["task_config"], cfg, [(1, 0)], start=4, steps=5)
        finally:
            if not restore:
                HeadFreezer.restore = saved
        after = model.state_dict()
        attn = "transformer.h.1.attn"
        frozen = [after[f"{attn}.{n}_proj.weight"][:8] for n in "qkv"] + [after[f"{attn}.out_proj.weight"][:, :8]]
        old = [before[f"{attn}.{n}_proj.weight"][:8] for n in "qkv"] + [before[f"{attn}.out_proj.weight"][:, :8]]
        assert all(torch.equal(a, b) for a, b in zip(frozen, old)) == restore
        assert not torch.equal(after[f"{attn}.q_proj.weight"][8:], before[f"{attn}.q_proj.weight"][8:])
        assert not torch.equal(
            after["transformer.h.0.attn.q_proj.weight"], before["transformer.h.0.attn.q_proj.weight"]
        )
    assert cost["frozen_params"] == 4 * 8 * 16
    assert cost["trainable_params"] == cost["params"] - 4 * 8 * 16


def test_cli_ablate_and_finetune_end_to_end(tmp_path):
    from transformers import GPTJForCausalLM
    from typer.testing import CliRunner

    from posym.cli import app

    run = _tiny_run(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "ablate",
            str(run),
            "--heads",
            "1.0",
            "--mode",
            "mean",
            "--n",
            "40",
            "--label-prompts",
            "8",
            "--save",
            str(tmp_path / "pruned"),
            "--out",
            str(tmp_path / "abl"),
        ],
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "abl" / "ablation.json").read_text())
    assert saved["conditions"] == {"1.0": "1.0"} and (tmp_path / "abl" / "ablation.png").is_file()
    pruned = GPTJForCausalLM.from_pretrained(tmp_path / "pruned")
    assert pruned.transformer.h[1].attn.out_proj.weight[:, :8].abs().max() == 0
    model, _ = load_checkpoint(tmp_path / "pruned")  # posym loads it too (posym.json carries the task)
    result = runner.invoke(
        app,
        [
            "finetune",
            str(run),
            "--freeze",
            "none",
            "--freeze",
            "0",
            "--train-steps",
            "3",
            "--n",
            "40",
            "--out",
            str(tmp_path / "ft"),
        ],
    )
    assert result.exit_code == 0, result.output
    costs = json.loads((tmp_path / "ft" / "finetune.json").read_text())["costs"]
    assert costs["0"]["frozen_unchanged"] is True and costs["none"]["frozen_params"] == 0
    assert costs["0"]["trainable_params"] == costs["none"]["trainable_params"] - 2 * 4 * 8 * 16


def test_cli_bad_heads_is_one_line_error(tmp_path):
    import subprocess
    import sys

    run = _tiny_run(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from posym.cli import main; main()",
            "ablate",
            str(run),
            "--heads",
            "9.0",
            "--label-prompts",
            "4",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["posym: error: head '9.0': layer 9 does not exist (layers 0..1)"]


# ---- RoPE planes of single heads (ablated_planes) --------------------------------------------------


def _query_rows(model, kind: str, layer: int, head: int, dims: list[int]) -> list[int]:
    """Rows of the layer's query projection that give head `head`'s query dims `dims` (the reference
    zeroes them in the weights: RoPE turns each plane within itself, so that is the ablation)."""
    config = model.config
    if kind == "neox":  # fused [q | k | v] per head: rows h * 3d + j are head h's query dim j
        d = config.hidden_size // config.num_attention_heads
        return [head * 3 * d + j for j in dims]
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return [head * d + j for j in dims]


def _query_projection(model, kind: str, layer: int):
    if kind == "gptj":
        return model.transformer.h[layer].attn.q_proj
    if kind == "neox":
        return model.gpt_neox.layers[layer].attention.query_key_value
    return model.model.layers[layer].self_attn.q_proj


@pytest.mark.parametrize(
    "kind, pairing, rotary",
    [("llama", "half", 8), ("qwen2", "half", 8), ("gptj", "interleaved", 4), ("neox", "half", 4)],
)
def test_plane_ablation_equals_zeroed_query_weights(kind, pairing, rotary):
    """Exact reference: the hooked model (float64) gives the logits of a copy whose query-projection rows
    (and biases) of the ablated planes are zero, on GQA (llama, qwen2 with q biases), interleaved GPT-J and
    partial-rotary NeoX; other heads and layers are untouched and the hook is gone afterwards."""
    import copy

    from tiny_llms import model_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(kind, 50, 64)).double().eval()
    ids = torch.randint(0, 50, (2, 12))
    planes = {(1, 2): [0, 1], (0, 1): [rotary // 2 - 1]}  # rotary / 2 planes: the slowest is rotary / 2 - 1
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for (layer, head), chosen in planes.items():
            proj = _query_projection(reference, kind, layer)
            rows = _query_rows(reference, kind, layer, head, plane_dims(chosen, pairing, rotary))
            proj.weight[rows] = 0.0
            if proj.bias is not None:
                proj.bias[rows] = 0.0
        clean = model(ids).logits
        with ablated_planes(model, planes):
            hooked = model(ids).logits
        after = model(ids).logits
        expected = reference(ids).logits
    assert (hooked - expected).abs().max().item() < 1e-12
    assert (hooked - clean).abs().max().item() > 1e-6  # the ablation changes something
    assert torch.equal(after, clean)


def _far_removed_reference(model, ids, layer, planes, max_distance):
    """Layer `layer`'s attention logits [B, H, T, T] written out key by key (-inf after the query): every plane's share
    scale * (R_n q)_m . (R_j k)_m (the model's own sin/cos table), the chosen planes' dropped where
    n - j > max_distance, the pass-through dims kept, causal mask, softmax."""
    hidden = model(ids, output_hidden_states=True).hidden_states[layer]  # [B, T, E] entering the layer
    attn, config = model.transformer.h[layer].attn, model.config
    x = model.transformer.h[layer].ln_1(hidden)
    B, T, E = x.shape
    H, r = config.n_head, config.rotary_dim
    d = E // H
    q, k = (x @ attn.q_proj.weight.T).view(B, T, H, d), (x @ attn.k_proj.weight.T).view(B, T, H, d)
    sin, cos = model.transformer.rotary_emb.embed_positions[:T].double().split(r // 2, dim=-1)  # [T, r/2] each
    out = torch.full((B, H, T, T), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for n in range(T):
                for j in range(n + 1):
                    total = q[b, n, h, r:] @ k[b, j, h, r:]  # the dims RoPE leaves alone
                    for m in range(r // 2):
                        if n - j > max_distance and m in planes.get((layer, h), []):
                            continue
                        qm = q[b, n, h, 2 * m : 2 * m + 2]
                        km = k[b, j, h, 2 * m : 2 * m + 2]
                        turn = lambda v, p: torch.stack(  # noqa: E731
                            (v[0] * cos[p, m] - v[1] * sin[p, m], v[1] * cos[p, m] + v[0] * sin[p, m])
                        )
                        total = total + turn(qm, n) @ turn(km, j)
                    out[b, h, n, j] = total / math.sqrt(d)
    return out


def test_far_planes_removed_equals_the_written_out_attention():
    """Exact reference (float64): the hooked layer's attention is the one written out key by key with the
    chosen planes dropped beyond the distance; other layers untouched, the hook gone afterwards; with
    every key near it is the model itself, with max_distance -1 it is ablated_planes."""
    model = build_model(_config(n_layer=2, n_head=2), 20, seed=5, attn_implementation="eager").double().eval()
    ids = torch.randint(1, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    planes = {(1, 0): [0], (1, 1): [0, 2]}
    with torch.no_grad():
        clean = model(ids, output_attentions=True)
        with far_planes_removed(model, planes, max_distance=3):
            hooked = model(ids, output_attentions=True)
        ref = _far_removed_reference(model, ids, 1, planes, 3)  # [B, H, T, T] logits
        torch.testing.assert_close(hooked.attentions[1], ref.softmax(-1), atol=1e-9, rtol=0)
        torch.testing.assert_close(hooked.attentions[0], clean.attentions[0], atol=1e-6, rtol=0)  # layer 0 untouched
        assert (hooked.attentions[1] - clean.attentions[1]).abs().max() > 1e-3  # it changes something
        assert torch.equal(model(ids).logits, clean.logits)  # the hook is gone
        with far_planes_removed(model, planes, max_distance=8):  # T = 9: no key is farther than 8
            torch.testing.assert_close(model(ids).logits, clean.logits, atol=1e-5, rtol=0)
        with far_planes_removed(model, planes, max_distance=-1):
            every = model(ids).logits
        with ablated_planes(model, planes):
            torch.testing.assert_close(every, model(ids).logits, atol=1e-5, rtol=0)
        # a penalty: the far keys' logits (n - j > 3) of head 1.1 lower by 0.7, on top of its removed planes
        with far_planes_removed(model, planes, max_distance=3, penalty={(1, 1): 0.7, (1, 0): 0.0}):
            shifted = model(ids, output_attentions=True).attentions[1]
        logits = ref.clone()
        far = ((torch.arange(9)[:, None] - torch.arange(9)[None, :]) > 3).double()  # [T, T]
        logits[:, 1] = logits[:, 1] - 0.7 * far
        torch.testing.assert_close(shifted, logits.softmax(-1), atol=1e-9, rtol=0)


def test_keys_hidden_is_the_prompt_without_those_keys():
    """Exact (float64): hidden from every head, the first E keys leave the later positions computing what the
    E-free prompt computes (RoPE sees distances only), the check scripts/letter_gap.py's hide_all rests on;
    hidden from one head, that head's attention is the written-out one with those keys at -inf for the
    queries from E on (earlier queries and the other heads as before); the hook is gone afterwards."""
    model = build_model(_config(n_layer=2, n_head=2), 20, seed=5, attn_implementation="eager").double().eval()
    ids = torch.randint(1, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    every = [(layer, h) for layer in range(2) for h in range(2)]
    with torch.no_grad():
        clean = model(ids, output_attentions=True)
        with keys_hidden(model, every, 3):
            hidden = model(ids).logits
        torch.testing.assert_close(hidden[:, 3:], model(ids[:, 3:]).logits, atol=1e-9, rtol=0)
        assert (hidden[:, 3:] - clean.logits[:, 3:]).abs().max() > 1e-3  # it changes something
        torch.testing.assert_close(hidden[:, :3], clean.logits[:, :3], atol=1e-9, rtol=0)  # earlier queries as before
        with keys_hidden(model, [(1, 1)], 3):
            one = model(ids, output_attentions=True)
        logits = _far_removed_reference(model, ids, 1, {}, 99)  # [B, H, T, T], no plane removed
        logits[:, 1, 3:, :3] = -math.inf
        torch.testing.assert_close(one.attentions[1], logits.softmax(-1), atol=1e-9, rtol=0)
        torch.testing.assert_close(one.attentions[0], clean.attentions[0], atol=1e-9, rtol=0)
        with keys_hidden(model, every, 0):  # nothing to hide
            torch.testing.assert_close(model(ids).logits, clean.logits, atol=1e-9, rtol=0)
        assert torch.equal(model(ids).logits, clean.logits)  # the hook is gone
    with pytest.raises(PosymError, match="count must be 0 or more"):
        with keys_hidden(model, every, -1):
            pass


def test_far_planes_removed_checks_its_input():
    from tiny_llms import model_config
    from transformers import AutoModelForCausalLM

    model = build_model(_config(), 20, seed=0, attn_implementation="eager").eval()
    with pytest.raises(PosymError, match="max_distance must be -1"):
        with far_planes_removed(model, {(0, 0): [0]}, max_distance=-2):
            pass
    with pytest.raises(PosymError, match="head 5.0 does not exist"):
        with far_planes_removed(model, {(5, 0): [0]}, max_distance=3):
            pass
    llama = AutoModelForCausalLM.from_config(model_config("llama", 50, 64))
    with pytest.raises(PosymError, match="GPT-J models"):
        with far_planes_removed(llama, {(0, 0): [0]}, max_distance=3):
            pass


def test_plane_dims_are_the_planes_of_pair_planes():
    x = torch.arange(8.0)
    for pairing in ("half", "interleaved"):
        planes = pair_planes(x, pairing, 8)  # [4, 2]
        for m in range(4):
            assert sorted(planes[m].long().tolist()) == plane_dims([m], pairing, 8)
    with pytest.raises(PosymError, match="planes must lie in 0..3"):
        plane_dims([4], "half", 8)


def test_plane_ablation_checks_heads_and_planes():
    from tiny_llms import model_config
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(model_config("llama", 50, 64)).eval()
    with pytest.raises(PosymError, match="head 0.7 does not exist"):
        with ablated_planes(model, {(0, 7): [0]}):
            pass
    with pytest.raises(PosymError, match="planes must lie in 0..3"), torch.no_grad():
        with ablated_planes(model, {(0, 0): [9]}):
            model(torch.zeros(1, 4, dtype=torch.long))
