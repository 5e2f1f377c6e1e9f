"""posym.core.geometry: per-plane scores against a channel-by-channel loop, frequency use on hand-made
tables and heads, q/k projections, and `posym geometry` end to end on a tiny trained run."""

import math
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from cli_runner import run_posym  # noqa: E402
from reference_scores import channel_dims, reference_swap_scores  # noqa: E402
from tiny_models import VOCAB, tiny_model  # noqa: E402
from tiny_runs import train_tiny  # noqa: E402

from posym.core import geometry, paper  # noqa: E402
from posym.errors import PosymError  # noqa: E402
from posym.core.qk import head_qk, rotate  # noqa: E402


def _model(kind: str, seed: int = 0):
    """Tiny eager float64 models (tests/tiny_models.py) with q/k scaled by 4: peaked, not one-hot."""
    return tiny_model(kind, seed=seed, qk_scale=4.0)


@pytest.mark.parametrize("kind", ["gptj", "gpt_neox", "llama"])
def test_plane_scores_match_channel_loop(kind):
    """Channels sum to HF's own attention; every channel's scores equal the swap-by-swap reference
    built from explicitly rotated per-position keys; max_logit is the channel's largest logit."""
    model = _model(kind)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in (9, 9, 7)]
    queries = [[8, 5], [8], [6, 3]]
    tau = 1e-2
    fast = geometry.plane_scores(model, prompts, queries, tau=tau, batch_size=2)
    for k, ids in enumerate(prompts):
        for layer in range(2):
            qk = head_qk(model, [ids], [layer])[layer]
            d, r = qk.q.shape[-1], qk.cos.shape[-1]
            channels = channel_dims(qk.pairing, r, d)

            def rotated(x, at):
                return rotate(x.double(), qk.cos[0, at].double(), qk.sin[0, at].double(), qk.pairing)

            with torch.no_grad():
                attn = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions[layer][0]
            for p in queries[k]:
                for head in range(2):
                    q_rot = rotated(qk.q[0, head, p], p)

                    def logit(c, at, content):  # channel c's logit of `content`'s key placed at `at`
                        return float(qk.scale * (q_rot[c] * rotated(qk.k[0, head, content], at)[c]).sum())

                    total = torch.zeros(p + 1, dtype=torch.float64)
                    rows = fast[
                        (fast.prompt == k) & (fast["query"] == p) & (fast.layer == layer) & (fast["head"] == head)
                    ]
                    assert len(rows) == len(channels)
                    for c, row in zip(channels, rows.itertuples()):
                        swapped = torch.tensor(
                            [[logit(c, a, b) for b in range(p + 1)] for a in range(p + 1)], dtype=torch.float64
                        )
                        ref = reference_swap_scores(swapped.diagonal(), swapped, tau=tau)
                        assert (row.s_pos, row.s_sym) == pytest.approx((ref["s_pos"], ref["s_sym"]), abs=1e-9)
                        assert row.max_logit == pytest.approx(float(swapped.diagonal().max()), abs=1e-8)
                        total += swapped.diagonal()
                    # GPT-J's eager attention computes its logits in float32 even in a float64 model
                    torch.testing.assert_close(
                        torch.softmax(total, 0), attn[head, p, : p + 1].double(), atol=1e-6, rtol=0
                    )
    ids = fast.groupby("channel").frequency_id.first().tolist()
    r = head_qk(model, [prompts[0]], [0])[0].cos.shape[-1]
    assert ids == list(range(1, r // 2 + 1)) + ([0] if kind != "llama" else [])


def test_plane_angles_are_gptj_frequencies():
    """theta_k read off the tables equals 10000^(-2(k-1)/r) (docs/method.md section 2)."""
    model = _model("gptj")
    frame = geometry.plane_scores(model, [[1, 2, 3, 4]], "last", layers=[0], heads=[0])
    rotary = frame[frame.frequency_id > 0].sort_values("frequency_id")
    expected = [10000 ** (-2 * (k - 1) / 8) for k in rotary.frequency_id]
    assert rotary.frequency.tolist() == pytest.approx(expected, rel=1e-6)  # GPT-J's table is float32
    assert frame[frame.frequency_id == 0].frequency.tolist() == [0.0]


def _one_plane_head(kind: str, plane: int):
    """One layer, one 16-dim head whose queries and keys live only in `plane` (keys = queries, so the
    query's own key gets |q|^2 > 0): every other channel contributes exactly 0."""
    if kind == "gptj":
        config = transformers.GPTJConfig(
            vocab_size=VOCAB, n_positions=64, n_embd=16, n_layer=1, n_head=1, rotary_dim=16
        )
    else:
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
    torch.manual_seed(4)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    attn = model.transformer.h[0].attn if kind == "gptj" else model.model.layers[0].self_attn
    dims = [2 * plane, 2 * plane + 1] if kind == "gptj" else [plane, plane + 8]
    with torch.no_grad():
        keep = torch.zeros(16, 1, dtype=torch.float64)
        keep[dims] = 1.0
        attn.q_proj.weight.mul_(keep)
        attn.k_proj.weight.copy_(attn.q_proj.weight)
        for proj in (attn.q_proj, attn.k_proj):
            if getattr(proj, "bias", None) is not None:
                proj.bias.zero_()
    return model


@pytest.mark.parametrize("kind, plane", [("gptj", 0), ("gptj", 5), ("llama", 2), ("llama", 7)])
def test_head_using_one_plane_reports_its_id(kind, plane):
    model = _one_plane_head(kind, plane)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, VOCAB, (12,), generator=gen).tolist() for _ in range(4)]
    planes = geometry.plane_scores(model, prompts, "all")
    others = planes[planes.frequency_id != plane + 1]
    assert others.max_logit.abs().max() == 0.0
    heads = geometry.frequency_use(planes)
    assert heads.weighted_id.tolist() == [plane + 1]
    assert heads.dominant_id.tolist() == [plane + 1]
    assert heads.weighted_frequency.iloc[0] == pytest.approx(10000 ** (-2 * plane / 16), rel=1e-6)


def test_frequency_use_on_a_hand_made_table():
    channels = pd.DataFrame(
        {
            "layer": [0] * 5 + [1] * 3,
            "head": [0] * 8,
            "channel": [0, 1, 2, 3, 4, 0, 1, 2],
            "frequency_id": [1, 2, 3, 4, 0, 1, 2, 3],
            "frequency": [1.0, 0.5, 0.25, 0.125, 0.0, 1.0, 0.5, 0.25],
            "s_pos": [0.0] * 8,
            "s_sym": [0.0] * 8,
            "use": [2.0, -1.0, 1.0, 0.0, 5.0, -1.0, -2.0, 0.0],
        }
    )
    heads = geometry.frequency_use(channels)
    first = heads.iloc[0]
    assert first.weighted_id == pytest.approx((1 * 2 + 3 * 1) / 3)  # the negative use gets weight 0
    assert first.weighted_frequency == pytest.approx((1.0 * 2 + 0.25 * 1) / 3)
    assert (first.dominant_id, first.free_use) == (1, 5.0)
    second = heads.iloc[1]
    assert math.isnan(second.weighted_id) and math.isnan(second.free_use) and second.dominant_id == 3
    # per-prompt rows are averaged first: use = mean max_logit
    rows = pd.DataFrame(
        {
            "prompt": [0, 0, 1, 1],
            "query": 5,
            "layer": 0,
            "head": 0,
            "channel": [0, 1, 0, 1],
            "frequency_id": [1, 2, 1, 2],
            "frequency": [1.0, 0.5, 1.0, 0.5],
            "s_pos": 0.0,
            "s_sym": 0.0,
            "max_logit": [1.0, 0.0, 3.0, 2.0],
        }
    )
    assert geometry.frequency_use(rows).weighted_id.iloc[0] == pytest.approx((1 * 2 + 2 * 1) / 3)


def test_weightings_on_hand_made_uses():
    """Each weighting against its definition written out plane by plane."""
    import numpy as np

    ids, use = [1, 2, 3, 4, 5], [2.0, -1.0, 1.0, 0.5, 0.5]
    got = geometry.weighted_ids(ids, use)
    assert got["linear"] == pytest.approx((1 * 2 + 3 * 1 + 4 * 0.5 + 5 * 0.5) / 4)
    assert got["dominant"] == 1.0
    # median 0.5: only planes 1 (excess 1.5) and 3 (excess 0.5) count
    assert got["floor"] == pytest.approx((1 * 1.5 + 3 * 0.5) / 2)
    e = [math.exp(u) for u in use]
    assert got["sharpened"] == pytest.approx(sum(i * w for i, w in zip(ids, e)) / sum(e), rel=1e-12)
    # equal uses: every weighting but dominant gives the uniform baseline (P + 1) / 2 or NaN
    flat = geometry.weighted_ids(ids, [0.3] * 5)
    assert flat["linear"] == flat["sharpened"] == pytest.approx(3.0) and math.isnan(flat["floor"])
    assert geometry.weighted_ids(ids, [1000.0, 999.0, 0, 0, 0])["sharpened"] == pytest.approx(
        (1 + 2 * math.exp(-1)) / (1 + math.exp(-1)), rel=1e-9
    )  # no overflow
    with pytest.raises(PosymError, match="unknown weighting"):
        geometry.plane_weights(np.zeros(3), "cubic")


def test_frequency_use_reports_every_weighting_with_the_uniform_baseline():
    uses = [0.1, 3.0, 0.1, 0.1, 0.0, 0.1]
    channels = pd.DataFrame(
        {
            "layer": 0,
            "head": 0,
            "channel": range(6),
            "frequency_id": range(1, 7),
            "frequency": [0.5**k for k in range(6)],
            "s_pos": 0.0,
            "s_sym": 0.0,
            "use": uses,
        }
    )
    head = geometry.frequency_use(channels.sample(frac=1, random_state=0)).iloc[0]  # order must not matter
    expected = geometry.weighted_ids(range(1, 7), uses)
    for name in geometry.WEIGHTINGS:
        assert head[f"weighted_id_{name}"] == pytest.approx(expected[name])
    assert head.weighted_id == head.weighted_id_linear and head.weighted_id_dominant == 2
    assert (head.planes, head.uniform_id) == (6, 3.5)
    # one dominant plane plus a flat positive bulk: linear is pulled toward the baseline, floor is not
    assert head.weighted_id_linear > head.weighted_id_floor == pytest.approx(2.0)


def test_qk_projection_identical_keys_and_rotation():
    """A positional head (every key the same vector) puts all keys on one point before rotation;
    after rotation each point is turned by position * theta."""
    model = _one_plane_head("gptj", 1)
    with torch.no_grad():
        model.transformer.h[0].ln_1.weight.zero_()  # LayerNorm output = its bias for every token
        model.transformer.h[0].ln_1.bias.normal_(0, 1.0)
    proj = geometry.qk_projection(model, [3, 9, 4, 1, 7], 0, 0, 2)
    keys = proj[proj.role == "key"]
    assert keys.x.max() - keys.x.min() < 1e-12 and keys.y.max() - keys.y.min() < 1e-12  # one point
    assert keys.x.abs().iloc[0] > 1e-3
    theta = 10000 ** (-2 / 16)
    for r in proj.itertuples():
        c, s = math.cos(r.position * theta), math.sin(r.position * theta)
        assert (r.x_rot, r.y_rot) == pytest.approx((c * r.x - s * r.y, s * r.x + c * r.y), abs=1e-6)
    with pytest.raises(PosymError, match="frequency_id"):
        geometry.qk_projection(model, [3, 9, 4], 0, 0, 9)
    with pytest.raises(PosymError, match="heads"):
        geometry.plane_scores(model, [[3, 9, 4]], heads=[1])


def _index_projection(theta, tokens, offsets, turn=None):
    """A qk_projection frame of T_Index on one plane: every key the vector v, an integer's query v turned
    back by sigma * theta (symbols query v), then RoPE turns each by its position; `turn` overrides the
    per-position query turn."""
    rows = []
    v = 2.0 * np.exp(0.7j)
    for p, t in enumerate(tokens):
        back = offsets.get(t, 0) * theta if turn is None else turn[p]
        for role, z in (("key", v), ("query", v * np.exp(-1j * back))):
            r = z * np.exp(1j * p * theta)
            rows.append(
                {
                    "layer": 1,
                    "head": 0,
                    "frequency_id": 1,
                    "position": p,
                    "role": role,
                    "token": t,
                    "x": z.real,
                    "y": z.imag,
                    "x_rot": r.real,
                    "y_rot": r.imag,
                }
            )
    return pd.DataFrame(rows)


def test_index_alignment_reads_the_index_construction():
    """T_Index on its plane: keys one direction, every integer's query on the key sigma back (error 0,
    always the nearest); queries turned by unrelated angles: concentrated keys still, but the phase error is
    large and the target rarely the nearest."""
    offsets = {i: i for i in range(1, 5)}  # token id i encodes offset i
    tokens = [7, 8, 9, 7, 8, 1, 2, 4, 3, 1, 2, 4, 3, 3]
    exact = geometry.index_alignment(_index_projection(1.0, tokens, offsets), offsets)
    assert exact["key_concentration"] == pytest.approx(1.0)
    assert exact["phase_error_deg"] == pytest.approx(0.0, abs=1e-9) and exact["target_nearest"] == 1.0
    assert exact["queries"] == 9 and exact["query_concentration"] < 0.9  # they fan out
    turns = np.random.default_rng(0).uniform(0, 2 * np.pi, len(tokens))
    scrambled = geometry.index_alignment(_index_projection(1.0, tokens, offsets, turn=turns), offsets)
    assert scrambled["key_concentration"] == pytest.approx(1.0)
    assert scrambled["phase_error_deg"] > 30 and scrambled["target_nearest"] <= 0.5
    none = geometry.index_alignment(_index_projection(1.0, [7, 8, 9], offsets), offsets)
    assert none["queries"] == 0 and np.isnan(none["phase_error_deg"])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("geo"), "letter", steps=20, every=10, batch_size=16)


def test_cli_geometry_end_to_end(tiny_run, tmp_path, monkeypatch, capsys):
    import json

    out = tmp_path / "geo"
    assert run_posym(monkeypatch, "geometry", tiny_run, "--n", 6, "--queries", "hops", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "weighted frequency ID per layer" in printed and "queries: hops" in printed
    planes, heads = pd.read_parquet(out / "planes.parquet"), pd.read_parquet(out / "frequency.parquet")
    assert sorted(planes.layer.unique()) == [0, 1] and planes.frequency_id.max() == 16
    assert planes.prompt.nunique() == 6 and planes["query"].nunique() > 1
    assert heads.weighted_id.between(1, 16).all()
    summary = json.loads((out / "geometry.json").read_text())
    assert (summary["planes"], summary["uniform_id"]) == (16, 8.5) and (heads.planes == 16).all()
    assert set(summary["weightings"]) == set(geometry.WEIGHTINGS)
    for name in geometry.WEIGHTINGS:
        assert summary["weightings"][name] == pytest.approx(
            heads.groupby("layer")[f"weighted_id_{name}"].mean().round(2).tolist()
        )
        assert heads[f"weighted_id_{name}"].between(1, 16).all()
    assert summary["paper_table1"] == paper.TABLE1["letter"]
    assert summary["plane_figure"]["layer"] == 1
    assert summary["plane_figure"]["index_alignment"] is None  # a letter run: no integers, no offsets
    assert summary["settings"]["queries"] == "hops" and summary["settings"]["step"] == 20  # what was analysed
    qk = pd.read_parquet(out / "qk_plane.parquet")
    assert len(qk) == 2 * 17 and set(qk.frequency_id) == {summary["plane_figure"]["frequency_id"]}
    for name in ("fig8_frequency", "fig4b_qk_plane"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").is_file()
    # deterministic: the same command gives the same numbers
    assert run_posym(monkeypatch, "geometry", tiny_run, "--n", 6, "--queries", "hops", "--out", tmp_path / "g2") == 0
    pd.testing.assert_frame_equal(planes, pd.read_parquet(tmp_path / "g2" / "planes.parquet"))
    capsys.readouterr()
    assert run_posym(monkeypatch, "geometry", tiny_run, "--plane-layer", 5, "--n", 2, "--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("posym: error: --plane-layer") and err.count("\n") == 1
    assert run_posym(monkeypatch, "geometry", tmp_path / "nothing") == 2


def test_cli_geometry_on_a_hugging_face_llama_dir(tmp_path, monkeypatch, capsys):
    """A non-posym RoPE model directory (half-split planes) with a JSONL prompt file."""
    import json

    from tiny_llms import save_model, tokenizer

    model_dir = save_model(tmp_path / "llama", "llama", tokenizer())
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": list(range(3, 3 + n))}) + "\n" for n in (9, 12)))
    assert run_posym(monkeypatch, "geometry", model_dir, "--prompts", prompts, "--out", tmp_path / "out") == 0
    planes = pd.read_parquet(tmp_path / "out" / "planes.parquet")
    assert planes.prompt.nunique() == 2 and set(planes["query"]) == {8, 11}
    capsys.readouterr()
    assert run_posym(monkeypatch, "geometry", model_dir, "--prompts", prompts) == 2
    assert "give --out" in capsys.readouterr().err
