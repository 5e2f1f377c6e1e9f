"""What a head type predicts: posym.core.stats, posym.core.retention, posym.prompts and
posym.commands.llm_study.prediction (the screen / lengths / causal stages of `posym llm-study`; the stages on a
tiny model are in tests/test_llm_study.py, the committed SmolLM2 tables at the end)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_llms import tokenizer
from tiny_models import FAMILIES, KINDS, WINDOWED, tiny_model

from posym import prompts as prompt_sets
from posym.commands.llm_study import prediction
from posym.core import constructions, retention, stats, theory
from posym.core.tasks import task_config
from posym.errors import PosymError

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "llm-study"


# ---- stats ------------------------------------------------------------------------------------------


def test_wilson_interval_known_values_and_edges():
    lo, hi = stats.wilson_interval(18, 20)
    assert lo == pytest.approx(0.6990, abs=1e-4) and hi == pytest.approx(0.9721, abs=1e-4)
    assert stats.wilson_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and stats.wilson_interval(10, 10)[1] == 1.0
    assert all(math.isnan(v) for v in stats.wilson_interval(0, 0))
    # the normal approximation's interval at p = 0.5 and large n agrees
    lo, hi = stats.wilson_interval(5000, 10000)
    assert hi - lo == pytest.approx(2 * 1.96 * 0.005, rel=1e-3)


def test_bootstrap_weights():
    w = stats.bootstrap_weights(7, 500, seed=3)
    assert w.shape == (500, 7) and (w.sum(1) == 7).all()
    assert np.array_equal(w, stats.bootstrap_weights(7, 500, seed=3))  # seeded
    assert abs(w.mean() - 1.0) < 0.05


# ---- retention: the maths -----------------------------------------------------------------------------


def test_row_measures_by_hand():
    logits = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    margin, top, attn_top, probs = retention.row_measures(logits)
    assert margin.tolist() == [1.0, 0.0] and top.tolist()[0] == 1
    e = math.exp
    assert attn_top[0].item() == pytest.approx(e(2) / (1 + e(2) + e(1)), abs=1e-15)
    assert torch.allclose(probs.sum(-1), torch.ones(2, dtype=torch.float64))


def test_head_measures_match_eager_attention_weights():
    model = tiny_model("llama")  # float64, eager
    ids = [[3, 5, 7, 9, 11, 2, 4, 6, 8, 10, 12, 1]]
    frame = retention.head_measures(model, ids, "last", tracked=lambda p, q: 4)
    with torch.no_grad():
        attn = model(torch.tensor(ids), output_attentions=True).attentions  # per layer [1, H, T, T]
    for row in frame.itertuples():
        weights = attn[row.layer][0, row.head, row.query]  # [T]
        assert row.attn_top == pytest.approx(float(weights.max()), abs=1e-6)  # eager attention: float32 logits
        assert row.top_key == int(weights.argmax())
        assert row.attn_tracked == pytest.approx(float(weights[4]), abs=1e-6)
        top2 = torch.log(weights).topk(2).values  # log-weights differ from logits by a constant per row
        assert row.margin == pytest.approx(float(top2[0] - top2[1]), abs=1e-4)
    assert set(frame.columns) == set(retention.MEASURE_COLUMNS) and len(frame) == 2 * 4
    # a tracked key after the query is no key of its row: NaN, not a number
    late = retention.head_measures(model, ids, [8], tracked=lambda p, q: 10)
    assert late.attn_tracked.isna().all() and not late.tracked_seen.any()


@pytest.mark.parametrize("kind", ["llama", *WINDOWED])
def test_head_measures_answer_keys_sinks_and_keys_outside_the_window(kind):
    """attn_answer sums the attention on the answer keys, top_free is the top key without the sinks,
    and a tracked key before a sliding window (4 keys here) is lost: attention 0, never NaN."""
    model = tiny_model(kind, window=4) if kind in WINDOWED else tiny_model(kind)
    ids = [[3, 5, 7, 9, 11, 2, 4, 6, 8, 10, 12, 1]]
    frame = retention.head_measures(model, ids, "last", tracked=lambda p, q: 2, answer=lambda p: [2, 5], exclude=(0,))
    with torch.no_grad():
        attn = model(torch.tensor(ids), output_attentions=True).attentions  # per layer [1, H, T, T]
    for row in frame.itertuples():
        weights = attn[row.layer][0, row.head, row.query].double()  # [T]; 0 outside the window
        assert row.attn_answer == pytest.approx(float(weights[2] + weights[5]), abs=1e-6)
        assert row.attn_tracked == pytest.approx(float(weights[2]), abs=1e-6)
        assert not math.isnan(row.attn_tracked) and row.tracked_seen == bool(weights[2] > 0)
        free = weights.clone()
        free[0] = -1.0
        assert row.top_free == int(free.argmax()) and row.top_free != 0
    if kind in WINDOWED:  # the window drops key 2 on the local layers: those heads lost it
        assert (~frame.tracked_seen).any() and (frame.attn_tracked[~frame.tracked_seen] == 0).all()
        assert (frame.attn_answer[~frame.tracked_seen] < 1e-6).all()  # key 5 lies outside too (first key 8)
    none = retention.head_measures(model, ids, "last")
    assert none.attn_answer.isna().all() and none.attn_tracked.isna().all()


def test_base_tracking_follows_moved_tokens():
    model = tiny_model("qwen2")
    base = [[3, 5, 7, 9, 11, 2, 4, 6]]
    long = [[13, 14, 15, 16] + base[0]]  # four tokens prepended: every base position moves by 4
    first = retention.head_measures(model, base)
    tracked = retention.base_tracking(first, lambda prompt, pos: pos + 4)
    moved = retention.head_measures(model, long, tracked=tracked)
    assert (moved.tracked_key.to_numpy() == first.top_key.to_numpy() + 4).all()
    same = retention.head_measures(model, base, tracked=retention.base_tracking(first, lambda p, pos: pos))
    assert np.allclose(same.attn_tracked, same.attn_top, atol=1e-12)


def _construction_measures(head, cfg, base_ids, extras, rng, *, avoid=None):
    """Measures of a construction head at its base inputs lengthened by E prepended tokens (drawn from
    each input's own tokens, never the position `avoid` gives, so no second match appears)."""
    rows = []
    for extra in extras:
        ids = base_ids
        if extra:
            pool = [
                [t for j, t in enumerate(row.tolist()[:-1]) if avoid is None or j != int(avoid[i])]
                for i, row in enumerate(base_ids)
            ]
            front = torch.tensor([[p[int(rng.integers(len(p)))] for _ in range(extra)] for p in pool])
            ids = torch.cat((front, base_ids), dim=1)
        logits = constructions.attention_logits(head, ids, last_only=True)[:, 0]  # [B, L]
        margin, _, attn_top, _ = retention.row_measures(logits)
        rows.append(
            pd.DataFrame(
                {
                    "prompt": range(len(ids)),
                    "query": ids.shape[1] - 1,
                    "layer": 0,
                    "head": 0,
                    "length": ids.shape[1],
                    "margin": margin.numpy(),
                    "attn_tracked": attn_top.numpy(),
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


def test_retention_of_hand_built_positional_head_falls_and_symbolic_head_holds():
    rng = np.random.default_rng(0)
    number = task_config("number")
    index = constructions.index_head(number, theory.frequency_angle(2))
    ids = theory.index_inputs(number, 16)[:200]  # [200, 17]: queries at position 16
    falls = retention.head_retention(_construction_measures(index, number, ids, [0, 17, 51], rng), base_length=17)
    letter = task_config("letter")
    retr = constructions.retrieval_head(letter, theory.frequency_angle(42))
    ids, _ = theory.retrieval_inputs(letter, 16, theory.frequency_angle(42), samples=200)
    ids = ids[:200]
    holds = retention.head_retention(
        _construction_measures(retr, letter, ids, [0, 17, 51], rng, avoid=theory.target_key(letter, ids)),
        base_length=17,
    )
    at = lambda t, n: float(t[t.length == n].margin_retention.iloc[0])  # noqa: E731
    assert at(falls, 68) < 0.3 and at(falls, 34) < at(falls, 17) == 1.0  # T_Index: the 2 pi^2 / n^2 squeeze
    # T_Retrieval keeps most of its margin while n theta < omega / 2: the nearest other letter's logit
    # cos(omega - n theta) creeps up only by the slow plane's turn (1 - cos(omega - 68 theta)) / (1 - cos omega) ~ 0.6
    assert at(holds, 68) > 0.6 and at(holds, 68) > 3 * at(falls, 68) and at(holds, 34) > 0.85


def test_group_retention_intervals_pooling_and_matching():
    rng = np.random.default_rng(1)
    rows = []
    for prompt in range(12):
        for layer in range(3):
            for head in range(4):
                base = 1.0 + rng.random()
                for length, factor in ((8, 1.0), (16, 0.5 if head == 0 else 1.0)):
                    rows.append(
                        {
                            "prompt": prompt,
                            "query": length - 1,
                            "layer": layer,
                            "head": head,
                            "length": length,
                            "margin": base * factor * (1 + 0.1 * rng.standard_normal()),
                            "attn_tracked": 0.5,
                        }
                    )
    measures = pd.DataFrame(rows)
    group = [(0, 0), (1, 0), (2, 0)]
    every = [(l, h) for l in range(3) for h in range(4)]
    draws = retention.matched_random(every, group, 5, seed=2)
    assert all(sorted(l for l, _ in d) == [0, 1, 2] and not set(d) & set(group) for d in draws)
    groups = {"positional": group, **{f"random:positional:{i}": d for i, d in enumerate(draws)}}
    table = retention.group_retention(measures, groups, base_length=8, n_boot=300)
    margin = table[table.measure == "margin"].set_index(["group", "length"])
    assert set(table.group) == {"positional", "random:positional"}
    assert margin.loc[("positional", 16), "value"] == pytest.approx(0.5, abs=0.1)
    assert margin.loc[("random:positional", 16), "value"] == pytest.approx(1.0, abs=0.1)
    assert margin.loc[("random:positional", 16), "draws"] == 5 and margin.loc[("positional", 16), "heads"] == 3
    assert ((table.lo <= table.value + 1e-12) & (table.value <= table.hi + 1e-12)).all()
    assert margin.loc[("positional", 16), "hi"] < margin.loc[("random:positional", 16), "lo"]  # separated
    with pytest.raises(PosymError, match="cannot draw"):
        retention.matched_random([(0, 0)], [(0, 0)], 1)
    with pytest.raises(PosymError, match="base length"):
        retention.group_retention(measures, groups, base_length=99)
    # one head per layer (the toy models): the match falls back to the nearest layer
    single = retention.matched_random([(l, 0) for l in range(4)], [(1, 0)], 3, seed=0)
    assert all(d[0][0] in (0, 2) for d in single)


def _attention_rows(n_prompts=16, drop_head=0, seed=3):
    """Measures of 3 layers x 6 heads whose attention on the answer key is 0.2 (+ noise) at the base
    length 8; at 16 the heads `drop_head` of every layer fall to a tenth, the others stay."""
    rng = np.random.default_rng(seed)
    rows = []
    for prompt in range(n_prompts):
        for layer in range(3):
            for head in range(6):
                for length in (8, 16):
                    keep = 0.1 if (length == 16 and head == drop_head) else 1.0
                    attn = 0.2 * keep * (1 + 0.2 * rng.standard_normal())
                    rows.append(
                        {
                            "prompt": prompt,
                            "query": length - 1,
                            "layer": layer,
                            "head": head,
                            "length": length,
                            "margin": 1.0 + rng.random(),
                            "attn_answer": attn,
                        }
                    )
    return pd.DataFrame(rows)


def test_group_retention_pooled_statistic_randomization_test_and_holm():
    """The pooled statistic is sum at L / sum at base over the group's heads; a group that loses its key
    against 200 matched random draws gets the smallest p the draws allow, Holm over the table's tests,
    and a verdict that follows from p_holm and the prompt-bootstrap interval; a group like random is
    'not separated'."""
    measures = _attention_rows()
    every = [(l, h) for l in range(3) for h in range(6)]
    losers, others = [(l, 0) for l in range(3)], [(l, 1) for l in range(3)]
    groups = {"losers": losers, "others": others}
    for name, members in (("losers", losers), ("others", others)):
        for i, d in enumerate(retention.matched_random(every, members, 200, seed=5)):
            groups[f"random:{name}:{i}"] = d
    table = retention.group_retention(measures, groups, base_length=8, n_boot=200, statistic={"attn_answer": "pooled"})
    at = table[(table.measure == "attn_answer") & (table.length == 16)].set_index("group")
    per_head = measures.groupby(["layer", "head", "length"]).attn_answer.mean().unstack("length")
    pooled = per_head.loc[losers, 16].sum() / per_head.loc[losers, 8].sum()
    assert at.loc["losers", "value"] == pytest.approx(pooled, rel=1e-12) and at.loc["losers", "value"] < 0.2
    assert at.loc["losers", "statistic"] == "pooled" and at.loc["losers", "draws"] == 1
    assert at.loc["random:losers", "draws"] == 200
    assert at.loc["losers", "p_random"] == pytest.approx(1 / 201)  # below every draw (no draw holds a loser)
    assert at.loc["others", "p_random"] > 0.05
    base = table[table.length == 8]
    assert base.p_random.isna().all()  # retention is 1 at the base length: no test
    judged = retention.holm_verdicts(table[table.measure == "attn_answer"], effect=0.2)
    tested = judged[judged.p_random.notna()]
    assert (tested.family == 2).all() and len(tested) == 2
    row = judged[(judged.group == "losers") & (judged.length == 16)].iloc[0]
    assert row.p_holm == pytest.approx(2 / 201) and row.verdict == "loses more than random"
    assert row["diff"] < 0 and row.diff_hi < 0 and row.mde > 0 and row.needed >= 2
    other = judged[(judged.group == "others") & (judged.length == 16)].iloc[0]
    assert other.verdict == "not separated"
    # the verdict follows from its numbers: a p_holm above alpha can never give a separation
    shown = judged.dropna(subset=["verdict"])
    separated = (shown.p_holm < 0.05) & ((shown.diff_lo > 0) | (shown.diff_hi < 0))
    assert ((shown.verdict != "not separated") == separated).all()


def test_matched_random_keeps_layer_kinds_and_refuses_what_cannot_be_matched():
    every = [(l, h) for l in range(4) for h in range(2)]
    kinds = {0: "local", 1: "global", 2: "local", 3: "global"}
    draws = retention.matched_random(every, [(1, 0), (1, 1)], 50, seed=0, kinds=kinds)  # layer 1 fully taken
    assert {kinds[l] for d in draws for l, _ in d} == {"global"} and {l for d in draws for l, _ in d} == {3}
    with pytest.raises(PosymError, match="of kind global"):
        retention.matched_random(every, [(1, 0), (1, 1), (3, 0), (3, 1)], 1, kinds=kinds)


# ---- the length families ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def builder():
    return prompt_sets.Builder(tokenizer())


@pytest.mark.parametrize("fmt", prompt_sets.FORMATS)
@pytest.mark.parametrize("variant", prompt_sets.VARIANTS)
def test_families_keep_every_base_token_and_the_answer(builder, fmt, variant):
    family = prompt_sets.LengthFamily(fmt, variant=variant, factors=[1, 2, 4])
    prompts = prompt_sets.build(family, builder, 6, seed=3)
    base = prompts[1][0].length
    for factor, group in prompts.items():
        assert {len(p.ids) for p in group} == {factor * base} and all(p.length == factor * base for p in group)
        for p, b in zip(group, prompts[1]):
            assert (p.answer, p.answer_id, p.query, p.index) == (b.answer, b.answer_id, p.length - 1, b.index)
            assert all(p.ids[p.position_map(k)] == t for k, t in enumerate(b.ids))  # every base token kept
            assert p.inserted == p.length - base
    long = prompts[4][0]
    if variant == "between":  # the facts stay at their positions, the question moves away
        assert long.ids[: long.insert_at] == prompts[1][0].ids[: long.insert_at]
    else:  # everything but the base prompt's own leading filler comes after the inserted distractors
        head, tail, _ = builder.core_ids(family.core(3, 0, builder.keys))
        assert long.insert_at == len(builder.bos) + base - len(head) - len(tail) - len(builder.encode("\n"))


@pytest.mark.parametrize("fmt", [*prompt_sets.FORMATS, "kv-code:facts=6:competing=3"])
@pytest.mark.parametrize("variant", prompt_sets.VARIANTS)
@pytest.mark.parametrize("markers", [False, True])
def test_families_know_their_answer_bearing_keys(builder, fmt, variant, markers):
    """Every prompt's answer_keys hold the token of each answer fact's value, at every length, and they
    are the same base tokens moved as `position_map` moves them (what attn_answer reads). With competing
    keys it is the fresh value's fact, never a stale one (the lengths stage failed on none before)."""
    family = prompt_sets.LengthFamily(fmt, variant=variant, markers=markers, factors=[1, 4])
    prompts = prompt_sets.build(family, builder, 6, seed=3)
    for factor, group in prompts.items():
        for p, b in zip(group, prompts[1]):
            core = family.core(3, p.index, builder.keys)
            wanted = [builder.encode(v)[-1] for v in core.answer_values]
            # both operands' facts for a sum; none named for a chain of assignments (each step bears it)
            assert (
                len(p.answer_keys) == {"arithmetic": 2, "arith-facts": 2, "arith-chain": 0}.get(fmt, 1) == len(wanted)
            )
            assert [p.ids[k] for k in p.answer_keys] == wanted
            assert all(k < p.query - len(builder.encode(core.question[-1])) for k in p.answer_keys)  # in the facts
            assert list(p.answer_keys) == [p.position_map(k) for k in b.answer_keys]
    if fmt.split(":")[0] in ("kv-code", "kv-list", "possession"):  # the value token is the answer token itself
        assert all(p.ids[p.answer_keys[0]] == p.answer_id for p in prompts[4])
    if "competing" in fmt:  # the key's fact is the fresh one: "The code of", not "The old code of"
        for p in prompts[1]:
            core = family.core(3, p.index, builder.keys)
            assert "old" not in core.facts[core.answer_facts[0]] and core.answer in core.facts[core.answer_facts[0]]


def test_families_answer_token_is_the_one_distinct_candidate_token(builder):
    for fmt in prompt_sets.FORMATS:
        core = prompt_sets.LengthFamily(fmt).core(0, 1, builder.keys)
        head, tail, answer = builder.core_ids(core)
        assert answer == builder.encode(core.answer)[-1]
        others = {builder.encode(c)[-1] for c in core.candidates if c != core.answer}
        assert answer not in others
    marked = prompt_sets.LengthFamily("kv-code", markers=True).core(0, 1)
    assert sum(m in " ".join(marked.facts) for m in prompt_sets.MARKERS) == 4
    assert any(m in marked.question[0] for m in prompt_sets.MARKERS)


def test_family_is_a_pure_function_of_seed_and_index(builder):
    family = prompt_sets.LengthFamily("copy", factors=[1, 2])
    a = prompt_sets.build(family, builder, 4, seed=5)
    b = prompt_sets.build(family, builder, 4, seed=5)
    c = prompt_sets.build(family, builder, 4, seed=6)
    assert [p.ids for p in a[2]] == [p.ids for p in b[2]] and [p.ids for p in a[2]] != [p.ids for p in c[2]]


def test_family_bad_input(builder):
    with pytest.raises(PosymError, match="format"):
        prompt_sets.LengthFamily("riddle")
    with pytest.raises(PosymError, match="variant"):
        prompt_sets.LengthFamily("copy", variant="after")
    with pytest.raises(PosymError, match="factors"):
        prompt_sets.LengthFamily("copy", factors=[2, 4])
    with pytest.raises(PosymError, match="positions"):
        prompt_sets.build(prompt_sets.LengthFamily("copy", factors=[1, 64]), builder, 2, max_positions=512)
    with pytest.raises(PosymError, match="n_screen"):
        prediction.PredictionConfig(n_screen=0)
    with pytest.raises(PosymError, match="n_probe"):
        prediction.PredictionConfig(n_screen=20, n_probe=30)
    with pytest.raises(PosymError, match="causal_factors"):
        prediction.PredictionConfig(causal_factors=[1, 3])


def test_screen_probes_every_format_and_completes_candidates_until_one_passes(builder, monkeypatch):
    """kv-code fails its probe (3/10), copy passes the probe but not the full screen (25 of 40),
    kv-list passes both (every answer right): kv-list is chosen and possession, after it, stays at the
    probe; every format tried is reported with its own n."""
    right = {
        "kv-code": lambda i: i % 10 < 3,
        "copy": lambda i: i < 10 or i % 2 == 0,
        "kv-list": lambda i: True,
        "possession": lambda i: True,
    }
    asked = []

    def fake(model, prompts):
        asked.append((prompts[0].family.split("/")[0], len(prompts)) if prompts else None)
        return [right[p.family.split("/")[0]](p.index) for p in prompts]

    monkeypatch.setattr(prediction, "next_token_correct", fake)
    config = prediction.PredictionConfig(formats=list(right), n_screen=40, n_probe=10)
    rows = prediction.screen(None, builder, config, seed=0, max_positions=4096)
    assert rows.groupby("format", sort=False).size().to_dict() == {
        "kv-code": 10,
        "copy": 40,
        "kv-list": 40,
        "possession": 10,
    }
    assert [r[0] for r in asked[4:]] == ["copy", "kv-list"]  # top-ups, in order, after the four probes
    summary = prediction.accuracy_by(rows, ["format"])
    chosen = prediction.choose_format(summary, config)
    assert (chosen["format"], chosen["prompts"], chosen["passes"]) == ("kv-list", 40, True)
    # possession is as accurate on its 10 probes, but has not the n_screen prompts a task needs
    only_probed = prediction.choose_format(summary[summary.format != "kv-list"], config)
    assert only_probed["passes"] is False


# ---- answers at every length: the shared-prefix path -------------------------------------------------


def _prefix_family(n=2, seed=0, vocab=40):
    """{factor: prompts} built like 'between' families: head + the first 8f tokens of a question's own
    filler stream + tail, so every shorter prompt shares all but its tail with the longest."""
    rng = np.random.default_rng(seed)
    out = {f: [] for f in (1, 2, 4)}
    for i in range(n):
        head, stream, tail = (rng.integers(2, vocab, size).tolist() for size in (4, 32, 3))
        for f in out:
            ids = head + stream[: 8 * f] + tail
            out[f].append(
                prompt_sets.LengthPrompt(
                    "t", i, f, len(ids), ids, " x", int(rng.integers(2, vocab)), 4 + 8, 8 * (f - 1), len(ids) - 1
                )
            )
    return out


def _tokens_run(model):
    """A counter of the token positions the model's forwards process (a hook on the input embedding)."""
    seen = [0]
    model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.__setitem__(0, seen[0] + args[0].numel())
    )
    return seen


FLOAT32_NORMS = 1e-6
"""How close two float64 passes of a tiny model can be: its norms round to float32 (see below)."""


@pytest.mark.parametrize("kind,window", [(k, None) for k in KINDS + FAMILIES] + [(k, 8) for k in WINDOWED])
def test_last_logits_share_prefixes_and_equal_full_forwards(kind, window):
    """Every length's last-position logits through one cached pass per question equal a full forward of
    that prompt (float64 models, to 1e-6: transformers' norms compute in float32 whatever the model's
    dtype (LlamaRMSNorm casts to it), so a float64 difference of 1e-16 between the cached and the full
    pass's products can flip a float32 rounding: on tiny llama the post-attention norm's output then
    differs by exactly one float32 ulp, 2.4e-7, and the logits by 8e-9; 8e-8 on olmo2, on an AVX-512
    machine, where the machine before had measured <= 1e-9 but GPT-J's 6.6e-9), and the pass runs only the longest
    prompt and each shorter one's tail: also where a sliding window (8 tokens; tiny Gemma 2/3 by default
    32) is shorter than the prompts, since the cache keeps every key and the model's mask applies the window."""
    model = tiny_model(kind, window=window) if window else tiny_model(kind)
    family = _prefix_family()
    seen = _tokens_run(model)
    got = list(prediction.last_logits(model, family))
    assert seen[0] == 2 * (39 + 2 * 3)  # per question: the longest (39 tokens), then two 3-token tails
    assert sorted((f, i) for f, i, _ in got) == sorted((f, i) for f in family for i in range(2))
    with torch.no_grad():
        for f, i, logits in got:
            full = model(input_ids=torch.tensor([family[f][i].ids])).logits[0, -1]
            assert torch.allclose(logits, full, atol=FLOAT32_NORMS, rtol=0), (kind, f, i)


def test_last_logits_fall_back_when_the_cache_cannot_be_cropped(monkeypatch):
    """A cache with a layer that does not keep every key (a model that replaces the one passed) is
    never cropped: each length then runs its own forward, with the same logits."""
    monkeypatch.setattr(prediction, "_croppable", lambda cache: False)
    model = tiny_model("mistral", window=8)
    family = _prefix_family()
    seen = _tokens_run(model)
    with torch.no_grad():
        for f, i, logits in prediction.last_logits(model, family):
            full = model(input_ids=torch.tensor([family[f][i].ids])).logits[0, -1]
            assert torch.allclose(logits, full, atol=FLOAT32_NORMS, rtol=0)
    assert seen[0] == 2 * sum(len(p.ids) for ps in family.values() for p in ps)  # both passes, every token


def test_correct_by_length_equals_one_forward_per_prompt():
    model = tiny_model("llama")
    family = _prefix_family(n=3, seed=1)
    with torch.no_grad():
        best = {
            f: [int(model(input_ids=torch.tensor([p.ids])).logits[0, -1].argmax()) for p in ps]
            for f, ps in family.items()
        }
    family = {
        f: [dataclasses.replace(p, answer_id=best[f][k] if k != 1 else (best[f][k] + 1) % 40) for k, p in enumerate(ps)]
        for f, ps in family.items()
    }
    assert prediction.correct_by_length(model, family) == {f: [True, False, True] for f in family}
    assert prediction.correct_by_length(model, family) == {
        f: prediction.next_token_correct(model, ps) for f, ps in family.items()
    }


@pytest.mark.parametrize("kind", KINDS)
def test_the_sdpa_kernel_gives_the_eager_answers_and_measures(kind):
    """`PredictionConfig.kernel`: the lengths stage's answers and head measures under PyTorch's fused attention
    equal the eager kernel's (float64 tiny models of every family, windowed ones with their window), and the
    model gets its own kernel back. Within 1e-6: the fused kernel orders its float64 sums otherwise (~1e-8 seen)."""
    model = tiny_model(kind, window=4) if kind in WINDOWED else tiny_model(kind)
    family = {  # the answer-bearing keys sit in the head, before the filler: they never move
        f: [dataclasses.replace(p, answer_keys=(1, 2)) for p in ps] for f, ps in _prefix_family(n=2, seed=2).items()
    }
    eager = prediction.measures_by_length(model, family, 2, sinks=[0])
    with torch.no_grad():
        logits = {(f, i): v for f, i, v in prediction.last_logits(model, family)}
    with prediction.attention_kernel(model, "sdpa"):
        assert model.config._attn_implementation == "sdpa"
        fused = prediction.measures_by_length(model, family, 2, sinks=[0])
        with torch.no_grad():
            for f, i, v in prediction.last_logits(model, family):
                torch.testing.assert_close(v, logits[(f, i)], atol=1e-6, rtol=0)
    assert model.config._attn_implementation == "eager"
    assert len(fused) == len(eager) and (fused.top_key == eager.top_key).all()
    for column in ("margin", "attn_top", "attn_tracked", "attn_answer"):
        np.testing.assert_allclose(fused[column], eager[column], atol=1e-6, rtol=0, equal_nan=True)


def test_kernel_and_factors_are_checked():
    with pytest.raises(PosymError, match="kernel must be one of eager, sdpa"):
        prediction.PredictionConfig(kernel="flash")
    with pytest.raises(PosymError, match=r"factors must lie in 1\.\.1024"):
        prediction.PredictionConfig(factors=[1, 2048])
    assert prediction.PredictionConfig(factors=[1, 128], causal_factors=[1], past_context=True).factors == [1, 128]


# ---- the causal table ---------------------------------------------------------------------------


def _causal_rows(n=40, draws=3):
    """Clean: right everywhere. 'symbolic' ablation: wrong at the long length on 3/4 of the prompts;
    'positional': wrong on half the prompts at every length; their random draws: wrong on a prompt now
    and then (1 in 10, seeded), so that the draws' drops spread."""
    rows = []
    rng = np.random.default_rng(7)
    for prompt in range(n):
        for factor, length in ((1, 10), (4, 40)):

            def add(group, draw, ok, ranking="sink-free", k=2):
                rows.append(
                    {
                        "k": k,
                        "mode": "mean",
                        "ranking": ranking,
                        "group": group,
                        "draw": draw,
                        "heads": "",
                        "factor": factor,
                        "length": length,
                        "prompt": prompt,
                        "correct": ok,
                    }
                )

            add("none", -1, True, ranking="none", k=0)
            add("symbolic", -1, not (factor == 4 and prompt % 4 != 0))
            add("positional", -1, prompt % 2 == 0)
            for draw in range(draws):
                add("random:symbolic", draw, bool(rng.random() > 0.1))
                add("random:positional", draw, bool(rng.random() > 0.1))
    return pd.DataFrame(rows)


def test_causal_table_drops_effects_and_separation():
    table = prediction.causal_table(_causal_rows(draws=200), n_boot=400).set_index(["group", "factor"])
    assert table.loc[("symbolic", 4), "drop"] == pytest.approx(0.75)
    assert table.loc[("symbolic", 4), "effect"] == pytest.approx(0.75)
    assert table.loc[("positional", 4), "drop"] == pytest.approx(0.5)
    assert table.loc[("positional", 4), "effect"] == pytest.approx(0.0)
    sym, pos = table.loc[("symbolic", 4)], table.loc[("positional", 4)]
    assert sym.p_effect == pytest.approx(1 / 201) and sym.p_floor == pytest.approx(1 / 201)
    assert sym.family == 6  # 2 groups x (2 drops + 1 length effect) in one Holm family
    assert sym.p_effect_holm == pytest.approx(min(1.0, 6 / 201)) and sym.separated == True  # noqa: E712
    assert pos.separated == False and pos.drop_separated == True  # noqa: E712 - it matters, not more at length
    assert table.loc[("random:symbolic", 4), "draws"] == 200
    assert pd.isna(table.loc[("symbolic", 1), "separated"])  # the base length is the reference
    assert (table.drop_lo <= table["drop"] + 1e-12).all() and (table["drop"] <= table.drop_hi + 1e-12).all()
    # the verdict follows from its numbers
    named = table[table.p_effect.notna()]
    follows = (named.p_effect_holm < 0.05) & ((named.vs_random_lo > 0) | (named.vs_random_hi < 0))
    assert (named.separated.astype(bool) == follows).all()


def test_causal_table_states_the_floor_of_few_draws_and_what_prompts_would_need():
    """With 3 draws no p can go below 1/4: nothing is separated, whatever the drop; the table says the
    minimal detectable effect at the n used and the prompts a 0.1 difference would need."""
    table = prediction.causal_table(_causal_rows(8), n_boot=400).set_index(["group", "factor"])
    sym = table.loc[("symbolic", 4)]
    assert sym.p_floor == pytest.approx(0.25) and sym.p_effect >= 0.25
    assert sym.separated == False and sym.drop_separated == False  # noqa: E712
    assert sym.mde_effect > 0 and sym.needed > 8
    assert sym.mde_effect == pytest.approx(
        stats.detectable_effect(sym.sd_effect, 8, alpha=0.05 / sym.family), rel=1e-12
    )


# ---- the committed SmolLM2 tables (docs/results/llm-study, default llm-study) ----------------------


def _committed(stage, table):
    path = RESULTS / stage / f"{table}.parquet"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run the study's screen/lengths/causal stages and copy them (docs/results.md)")
    return pd.read_parquet(path)


def test_committed_screen_has_a_task_the_model_solves():
    summary = _committed("screen", "summary")
    rows = _committed("screen", "screen")
    import yaml

    screened = yaml.safe_load((RESULTS / "study.yaml").read_text())["prediction"]["formats"]  # the run's formats
    assert set(summary.format) == set(screened) and (summary.n >= 50).all()  # every format tried, reported
    counts = rows.groupby("format").size()
    assert (counts.loc[summary.format].to_numpy() == summary.n.to_numpy()).all()
    chosen = json.loads((RESULTS / "screen" / "screen.json").read_text())
    best = summary.set_index("format").loc[chosen["format"]]
    assert best.acc >= 0.8 and best.n >= 200
    recomputed = rows.groupby("format").correct.mean()
    assert np.allclose(recomputed.loc[summary.format], summary.acc)
    for r in summary.itertuples():
        assert (r.lo, r.hi) == pytest.approx(stats.wilson_interval(round(r.acc * r.n), r.n))


def test_committed_lengths_tables():
    acc = _committed("lengths", "accuracy_summary")
    assert set(acc.layout) == {"between", "before", "marked"} and set(acc.factor) == set(prompt_sets.FACTORS)
    assert ((acc.lo <= acc.acc) & (acc.acc <= acc.hi)).all()
    groups = _committed("lengths", "group_retention")
    assert {"symbolic", "random:symbolic"} <= set(groups.group)
    assert ((groups.lo <= groups.value + 1e-9) & (groups.value <= groups.hi + 1e-9)).all()
    base = groups[groups.length == groups.groupby("layout").length.transform("min")]
    assert np.allclose(base.value, 1.0)
    kept = _committed("lengths", "head_retention")
    assert len(kept) == 2 * 2 * 270 * len(prompt_sets.FACTORS)  # layouts x rankings x SmolLM2's heads x lengths
    assert kept.attn_tracked.between(0, 1).all() and (kept.margin >= 0).all()


def test_committed_causal_table():
    """The withdrawn causal run (10 draws, no Holm: its 'separated' cannot stand), kept as it was measured;
    its prompts are those of the lengths stage before issue 50 (which now builds every layout at one length)."""
    table = _committed("causal-withdrawn", "causal_summary")
    named = table[~table.group.str.startswith("random")]
    assert set(named.group) == {"symbolic", "positional"} and set(named.ranking) == {"sink-free", "plain"}
    longer = named[named.factor > 1]
    assert longer.separated.notna().all() and (longer.separated.astype(bool) | longer.needed.notna()).all()
    assert (table[table.group.str.startswith("random")].draws == 10).all()
    assert set(table.factor) == set(prompt_sets.FACTORS)
    rows = _committed("causal-withdrawn", "causal")
    clean = rows[rows.group == "none"].groupby("factor").correct.mean()
    assert np.allclose(table.groupby("factor").acc_clean.first().loc[clean.index], clean)


def test_powered_preset_is_a_study_config_whose_causal_draws_can_pass_holm():
    """examples/llm-study-powered.yaml (the powered sizes, run in the background) is a valid StudyConfig
    whose causal p_floor times its Holm family (rankings x 2 groups x (2 drops + 1 effect)) is < 0.05."""
    from posym import configs, io
    from posym.commands.llm_study import StudyConfig

    path = Path(__file__).resolve().parents[1] / "examples" / "llm-study-powered.yaml"
    study = configs.from_dict(StudyConfig, io.read_yaml(path), where=str(path))
    p = study.prediction
    family = len(p.causal_rankings) * 2 * (len(p.causal_factors) + len(p.causal_factors) - 1)
    assert family / (p.causal_draws + 1) < 0.05 and p.draws >= 1000 and p.n_heads >= 32


# ---- the corrected verdicts (issue 50): committed lengths tables of both real models ---------------

STUDIES = {
    "smollm2": RESULTS,
    "gemma3": RESULTS.parent / "llm-study-gemma3",
    "smollm2-past": RESULTS.parent / "llm-study-past-context",
    "qwen0.5b": RESULTS.parent / "llm-study-qwen2.5-coder-0.5b",
}


@pytest.fixture(params=sorted(STUDIES))
def lengths_dir(request):
    return STUDIES[request.param] / "lengths"


def test_committed_group_retention_tests_follow_from_their_numbers(lengths_dir):
    """Every named group is tested against its own pool of >= 1,000 random draws; p_random respects the
    draws' floor, p_holm is Holm over each (layout, ranking, measure), and every verdict is what p_holm and
    the bootstrap interval of diff say: a changed number that no longer supports its verdict fails here."""
    groups = pd.read_parquet(lengths_dir / "group_retention.parquet")
    info = json.loads((lengths_dir / "lengths.json").read_text())
    assert {"attn_answer", "attn_tracked", "margin"} <= set(groups.measure)
    pools = groups[groups.group.str.startswith("random:")]
    assert (pools.draws >= 1000).all() and info["draws"] >= 1000
    tested = groups[groups.p_random.notna()]
    assert len(tested) and (tested.p_random >= 1 / (1 + pools.draws.max()) - 1e-12).all()
    for _, family in groups.groupby(["layout", "ranking", "measure"]):
        np.testing.assert_allclose(family.p_holm, stats.holm(family.p_random), rtol=0, atol=1e-12)
        assert (family.family[family.p_random.notna()] == family.p_random.notna().sum()).all()
    for row in tested.itertuples():
        side = row.diff_lo > 0 if row.diff > 0 else row.diff_hi < 0
        expect = (
            ("keeps more than random" if row.diff > 0 else "loses more than random")
            if (row.p_holm < 0.05 and side)
            else "not separated"
        )
        assert row.verdict == expect, (row.layout, row.ranking, row.measure, row.group, row.length)
        assert row.mde >= 0 and row.needed >= 2  # 0 where a group and its draws lost everything (no spread)
    base = groups[groups.length == groups.groupby("layout").length.transform("min")]
    assert np.allclose(base.value.dropna(), 1.0) and base.p_random.isna().all()


def test_committed_groups_keep_sinks_apart_and_count_their_heads(lengths_dir):
    """Sink-tracking heads are their own group and in no label group; each group's head count is what
    the labels give; where a model has local and global layers, groups are also reported per kind."""
    groups = pd.read_parquet(lengths_dir / "group_retention.parquet")
    heads = pd.read_parquet(lengths_dir / "heads.parquet")
    info = json.loads((lengths_dir / "lengths.json").read_text())
    for layout, sinks in info["sink_heads"].items():
        sinks = {tuple(h) for h in sinks}
        for ranking, rows in groups[groups.layout == layout].groupby("ranking"):
            labels = heads[(heads.layout == "between") & (heads.variant == ranking)]
            for label in ("positional", "symbolic", "mixed"):
                want = sum(
                    (int(a), int(b)) not in sinks
                    for a, b in zip(labels.layer[labels.label == label], labels["head"][labels.label == label])
                )
                got = rows[rows.group == label].heads.unique()
                assert (want == 0 and len(got) == 0) or list(got) == [want], (layout, ranking, label)
            if sinks:
                assert list(rows[rows.group == "sink"].heads.unique()) == [len(sinks)]
    kinds = info["layer_kinds"]
    named = {g for g in groups.group if not g.startswith("random:")}
    if kinds:
        assert {g.split("@")[1] for g in named if "@" in g} == set(kinds.values())
    else:
        assert not any("@" in g for g in named)


def test_gemma3_symbolic_retention_is_its_global_heads():
    """What docs/results.md and the README say of Gemma 3's symbolic heads at 16x (answer key, sink-free,
    distractors between): the group keeps more than random only through its global-layer heads; those on
    local layers keep nothing, like their random heads (the fact is outside their window)."""
    groups = pd.read_parquet(STUDIES["gemma3"] / "lengths" / "group_retention.parquet")
    at = groups[
        (groups.length == groups.length.max())
        & (groups.measure == "attn_answer")
        & (groups.layout == "between")
        & (groups.ranking == "sink-free")
    ].set_index("group")
    whole, glob, local = at.loc["symbolic"], at.loc["symbolic@global"], at.loc["symbolic@local"]
    assert (glob.heads, local.heads, whole.heads) == (2, 5, 7)
    assert glob.verdict == whole.verdict == "keeps more than random" and local.verdict == "not separated"
    assert local.value == local.null_median == 0
    page = (RESULTS.parents[2] / "docs" / "results.md").read_text()
    readme = (RESULTS.parents[2] / "README.md").read_text()
    quoted = f"{glob.value:.2f} [{glob.lo:.2f}, {glob.hi:.2f}] against {glob.null_median:.2f}, Holm p {glob.p_holm:.3f}"
    assert quoted in page
    assert f"its 2 on global layers ({glob.value:.2f} against {glob.null_median:.2f})" in " ".join(readme.split())


def test_committed_accuracy_tests_are_exact_mcnemar_with_holm(lengths_dir):
    tests = pd.read_parquet(lengths_dir / "accuracy_tests.parquet")
    accuracy = pd.read_parquet(lengths_dir / "accuracy.parquet")
    for row in tests.itertuples():
        a = accuracy[(accuracy.layout == row.layout_a) & (accuracy.factor == row.factor_a)].set_index("prompt").correct
        b = accuracy[(accuracy.layout == row.layout_b) & (accuracy.factor == row.factor_b)].set_index("prompt").correct
        assert row.only_a == int((a & ~b).sum()) and row.only_b == int((~a & b).sum()) and row.n == len(a)
        assert row.p == pytest.approx(stats.mcnemar_p(row.only_a, row.only_b), abs=1e-15)
        assert row.diff == pytest.approx(a.mean() - b.mean(), abs=1e-12)
    np.testing.assert_allclose(tests.p_holm, stats.holm(tests.p), atol=1e-12)
    assert (tests.separated == (tests.p_holm < 0.05)).all() and (tests.family == len(tests)).all()
    lengths = accuracy.groupby(["layout", "factor"]).length.first().unstack("layout")
    assert (lengths.nunique(axis=1) == 1).all()  # every layout at the same lengths: markers compared fairly


# ---- issue 52: difficulty knobs, arithmetic reasoning judged on the whole answer, the chat form ---------


def test_arith_formats_state_their_operands_and_answer_the_sum(builder):
    """arith-facts: the answer is the sum of the two named owners' coins (read back from the facts' text);
    arith-chain: the answer is the chain's value, evaluated from the facts in order (distractors included)."""
    import re

    for i in range(20):
        core = prompt_sets.LengthFamily("arith-facts", n_facts=5).core(1, i)
        coins = dict(re.findall(r"(\w+) has (\d+) coins", "".join(core.facts)))
        a, b = re.search(r"do (\w+) and (\w+) have", core.question[0]).groups()
        assert core.whole and len(core.facts) == 5 and core.answer == f" {int(coins[a]) + int(coins[b])}"
        chain = prompt_sets.LengthFamily("arith-chain", n_facts=5).core(1, i)
        values: dict[str, int] = {}
        for fact in chain.facts:  # "x = 7." or "y = x + 5." or "z = y - 3."
            name, expr = fact.strip(" .").split(" = ")
            left, *rest = expr.split()
            values[name] = (int(left) if left.isdigit() else values[left]) + (
                0 if not rest else int(rest[1]) * (1 if rest[0] == "+" else -1)
            )
        asked = re.fullmatch(r"\nWhat is (\w)\?", chain.question[0]).group(1)
        assert chain.answer == f" {values[asked]}" and values[asked] > 0 and len(chain.facts) == 5


def test_competing_keys_add_stale_values_of_the_asked_key(builder):
    plain = prompt_sets.LengthFamily("kv-code:facts=6").core(0, 3)
    hard = prompt_sets.LengthFamily("kv-code:facts=6:competing=3").core(0, 3)
    assert plain == prompt_sets.LengthFamily("kv-code", n_facts=6).core(0, 3)  # the spec is the fields
    stale = [f for f in hard.facts if "old code" in f]
    asked = hard.question[0].split("code of ")[1].rstrip("?")
    assert len(hard.facts) == 9 and len(stale) == 3 and any(f" {asked} was" in f for f in stale)
    assert len({c.strip() for c in hard.candidates}) == 9 and hard.answer not in {f" {f[-2]}" for f in stale}
    assert prompt_sets.LengthFamily("kv-code").core(0, 3) == prompt_sets.LengthFamily("kv-code:facts=4").core(0, 3)
    for bad, message in [
        ("kv-list:competing=1", "competing keys are a kv-code option .* got kv-list with 4 \\+ 1"),
        ("kv-code:facts=8:competing=2", "n_facts \\+ competing <= 9 .* got kv-code with 8 \\+ 2"),
        ("copy:chat", "copy has no chat form"),
        ("arith-chain:facts=2", "arith-chain needs n_facts >= 3 .* got 2"),
        ("kv:x", "format spec 'kv:x': each option is one of facts=N, competing=K, chat"),
    ]:
        with pytest.raises(PosymError, match=message):
            prompt_sets.LengthFamily(bad)
    with pytest.raises(PosymError, match="kv-code:size=3"):
        prediction.PredictionConfig(formats=["kv-code", "kv-code:size=3"])


class _Oracle(torch.nn.Module):
    """A stand-in causal LM whose greedy next token is the next token of its input (so it 'writes' any
    appended answer), except `wrong` positions from the end, and `after` once the input ends."""

    def __init__(self, vocab, after, wrong=()):
        super().__init__()
        self.vocab, self.after, self.wrong, self.weight = vocab, after, wrong, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, logits_to_keep=1):
        b, t = input_ids.shape
        best = torch.cat([input_ids[:, 1:], torch.full((b, 1), self.after)], 1)  # [b, T]
        for k in self.wrong:
            best[:, t - k] = (best[:, t - k] + 1) % self.vocab
        logits = torch.nn.functional.one_hot(best[:, -logits_to_keep:], self.vocab).float()  # [b, keep, vocab]
        return type("Out", (), {"logits": logits})()


def test_whole_answers_are_judged_on_every_token_and_where_they_stop(builder):
    prompts = prompt_sets.build(prompt_sets.LengthFamily("arith-facts", factors=[1]), builder, 4, seed=0)[1]
    vocab = len(builder.tokenizer)
    p = prompts[0]
    assert p.answer_ids and p.answer_ids[0] == p.answer_id and p.stops == builder.digits
    assert builder.tokenizer.decode(list(p.answer_ids)).strip() == p.answer.strip()
    period = builder.encode(".")[0]
    assert prediction.next_token_correct(_Oracle(vocab, after=period), prompts) == [True] * 4
    # the toy tokenizer writes whole numbers as one word (no digit stops); a stop after the answer: wrong
    digit = builder.encode("3")[0]
    stopped = [dataclasses.replace(q, stops=(digit,)) for q in prompts]
    assert prediction.next_token_correct(_Oracle(vocab, after=digit), stopped) == [False] * 4
    assert prediction.next_token_correct(_Oracle(vocab, after=period), stopped) == [True] * 4
    # a wrong token inside the answer (the first or the last answer token): wrong
    for k in (1, len(p.answer_ids)):
        assert prediction.next_token_correct(_Oracle(vocab, after=period, wrong=(k + 1,)), [p]) == [False]
    one = prompt_sets.build(prompt_sets.LengthFamily("kv-code", factors=[1]), builder, 2, seed=0)[1]
    assert one[0].answer_ids == () and prediction.next_token_correct(
        _Oracle(vocab, after=one[0].answer_id), one[:1]
    ) == [True]


def test_the_chat_form_wraps_the_question_in_the_template(builder, monkeypatch):
    from tiny_llms import tokenizer

    tok = tokenizer()
    tok.chat_template = "{% for m in messages %}[EOS] user {{ m['content'] }} [EOS]{% endfor %} assistant"
    chat = prompt_sets.Builder(tok)
    assert chat.chat == ("[EOS] user ", " [EOS] assistant")
    family = prompt_sets.LengthFamily("arith-chain:chat", variant="before", factors=[1, 2])
    core = family.core(0, 0)
    assert core.chat and not core.answer.startswith(" ") and core.question[-1].endswith("Answer with the number only.")
    head, tail, answer, lead = chat.core_parts(core)
    assert lead == len(chat.bos) + 2 and head[:lead] == chat.bos + chat.encode("[EOS] user ")
    assert tail[-2:] == chat.encode(" [EOS] assistant")
    long = prompt_sets.build(family, chat, 2, seed=0)[2][0]
    assert long.ids[:lead] == head[:lead] and long.insert_at >= lead  # the filler comes after the chat header
    with pytest.raises(PosymError, match="no chat template"):
        builder.core_parts(core)
    # the screen skips the chat forms where the model has no template, and reports the rest
    monkeypatch.setattr(prediction, "next_token_correct", lambda model, prompts: [True] * len(prompts))
    config = prediction.PredictionConfig(formats=["kv-code", "kv-code:chat"], n_screen=4, n_probe=4)
    assert set(prediction.screen(None, builder, config, seed=0, max_positions=4096).format) == {"kv-code"}
    assert set(prediction.screen(None, chat, config, seed=0, max_positions=4096).format) == {"kv-code", "kv-code:chat"}
    # and so does the study's size check before any stage runs (Gemma 3 270M base has no template)
    from posym import models
    from posym.commands import llm_study

    study = llm_study.StudyConfig(prediction=config)
    for either in (builder.tokenizer, tok):  # without a template the chat form is skipped, not refused
        loaded = models.LoadedModel(None, "tiny", "llama", 4096, "cpu", _tokenizer=either)
        assert llm_study.check_sizes(loaded, study, ["screen"]) is None


def test_committed_past_context_study():
    """SmolLM2 past its trained context (issue 50 item 4): lengths past max_position_embeddings (8,192), the paired
    tests of every layout past it against the longest trained length are prediction.accuracy_tests' own output
    (recomputed from accuracy.parquet with inside=, which postdates the run), and the study ran the sdpa kernel."""
    from posym.commands.llm_study import prediction

    lengths = STUDIES["smollm2-past"] / "lengths"
    info = json.loads((lengths / "lengths.json").read_text())
    accuracy = pd.read_parquet(lengths / "accuracy.parquet")
    assert info["past_context"] and info["kernel"] == "sdpa" and info["trained_context"] == 8192
    base = info["base_lengths"]["between"]
    inside = max(f for f in accuracy.factor.unique() if f * base <= 8192)
    assert info["inside_factor"] == inside and accuracy.length.max() > 8192
    assert (accuracy.groupby(["layout", "factor"]).size() == info["prompts"]["accuracy"]).all()
    tests = pd.read_parquet(lengths / "accuracy_tests.parquet")
    again = prediction.accuracy_tests(accuracy, effect=0.1, inside=inside)
    pd.testing.assert_frame_equal(tests.reset_index(drop=True), again, check_exact=False, rtol=1e-12)
    past = tests[tests.comparison.str.endswith(f"vs {inside}x")]
    assert len(past) == 3 * sum(f > inside for f in accuracy.factor.unique())


@pytest.mark.parametrize("study", ["smollm2", "gemma3", "qwen0.5b"])
def test_committed_causal_summary_is_its_rows_table(study):
    """docs/results/<study>/causal/causal_summary.parquet is `causal_table` of the committed causal.parquet
    under the study's own settings: every drop, interval, p, Holm p, MDE and verdict follows from the
    per-prompt rows, so a changed row or a verdict written by hand fails here."""
    from posym import configs, io
    from posym.commands.llm_study import StudyConfig

    root = STUDIES[study]
    config = configs.from_dict(StudyConfig, io.read_yaml(root / "study.yaml"), where="study.yaml")
    rows = pd.read_parquet(root / "causal" / "causal.parquet")
    table = prediction.causal_table(
        rows, n_boot=config.prediction.n_boot, seed=config.seed, effect=config.prediction.accuracy_effect
    )
    import io as bytes_io

    buffer = bytes_io.BytesIO()
    table.to_parquet(buffer)  # as the stage wrote it: Parquet types the columns of None
    committed = pd.read_parquet(root / "causal" / "causal_summary.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(buffer), committed)


# ---- the default study's cost (issue 50: inside ~20 minutes on 2 cores) -------------------------------

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


@pytest.mark.parametrize("name", ["llm_study_prediction.json", "llm_study_prediction_gemma3.json"])
def test_the_default_study_timing_is_of_todays_defaults(name):
    """benchmarks/prediction_study.py's record ran the prediction stages with the defaults as they are now
    (a change of the defaults they read without a new timing fails here; stages 1-6's own fields, such as
    bench_sizes, do not reach them), its total is the sum of its stages and its budget verdict follows."""
    import yaml

    from posym import configs
    from posym.commands.llm_study import StudyConfig

    record = json.loads((BENCHMARKS / name).read_text())
    ran, now = configs.from_dict(StudyConfig, yaml.safe_load(record["study_yaml"]), where=name), StudyConfig()
    assert ran.prediction == prediction.PredictionConfig() == now.prediction
    assert (ran.seed, ran.tau, ran.gammas[0]) == (now.seed, now.tau, now.gammas[0])  # what the three stages read
    assert set(record["stage_seconds"]) == {"screen", "lengths", "causal"}
    assert record["seconds"] == pytest.approx(sum(record["stage_seconds"].values()), abs=0.01)
    assert record["within_budget"] == (record["seconds"] <= record["budget_seconds"] == 1200)
    assert all(run["study_yaml"] != record["study_yaml"] for run in record.get("superseded_runs", []))


def test_the_causal_stage_comparison_is_of_the_default_run():
    """docs/benchmarks/causal_stage_ab.json (docs/results.md's cost paragraph): its new side is the causal stage
    of a whole default study's record in docs/benchmarks/llm_study.json (one it superseded: its 2 real draws
    were the default until issue 50's last cut to 1), its old side the earlier default's (3 real draws), its
    ratio and saving their quotient and difference, and the old and new named-group drops differ (the two
    mean-ablation definitions)."""
    import yaml

    record = json.loads((BENCHMARKS / "causal_stage_ab.json").read_text())
    study = json.loads((BENCHMARKS / "llm_study.json").read_text())
    old, new = record["old"], record["new"]
    (of,) = [
        run
        for run in [study, *study["superseded_runs"]]
        if run.get("stage_seconds", {}).get("causal") == new["seconds"]
        and run["stage_cpu_seconds"]["causal"] == new["cpu_seconds"]
    ]
    then = yaml.safe_load(of["study_yaml"])["prediction"]
    assert new["causal_draws"] == then["causal_draws"] == 2 != old["causal_draws"] == 3
    assert record["ratio"] == round(old["seconds"] / new["seconds"], 3) and old["seconds"] > new["seconds"]
    assert record["saved_seconds"] == pytest.approx(old["seconds"] - new["seconds"], abs=0.01)
    assert (
        set(old["named_groups"])
        == set(new["named_groups"])
        == {f"{g} {f}x" for g in prediction.CAUSAL_GROUPS for f in prediction.PredictionConfig().causal_factors}
    )
    assert all(old["named_groups"][k]["drop"] > new["named_groups"][k]["drop"] for k in new["named_groups"])


def test_the_study_profile_is_what_the_cost_paragraph_quotes():
    """docs/benchmarks/llm_study_profile.json (py-spy on the screen and the lengths stage's accuracy passes): its
    shares are of its samples (by stage they sum to 1), and docs/results.md quotes its forward-pass share."""
    record = json.loads((BENCHMARKS / "llm_study_profile.json").read_text())
    assert sum(record["share_by_stage"].values()) == pytest.approx(1, abs=0.002)
    assert 0 < record["share_in_model_forward"] <= 1 and record["samples"] > 1000
    assert sum(record["share_by_posym_function"].values()) <= 1
    text = (BENCHMARKS.parents[1] / "docs" / "results.md").read_text()
    assert f"{record['share_in_model_forward']:.3f} of their samples in the model's forward passes" in text.replace(
        "\n", " "
    )


def test_the_whole_default_study_timing_is_of_todays_defaults():
    """benchmarks/real_model.py --part study's record (docs/benchmarks/llm_study.json, read in docs/results.md)
    ran every stage with today's defaults, its two parts are its stages' sums, and the command's wall time
    holds them (loading the model and the report are the rest)."""
    import sys

    import yaml

    from posym import configs
    from posym.commands.llm_study import StudyConfig, study_stages
    from posym.runs import PREDICTION_STAGES

    record = json.loads((BENCHMARKS / "llm_study.json").read_text())
    ran = configs.from_dict(StudyConfig, yaml.safe_load(record["study_yaml"]), where="llm_study.json")
    assert ran == StudyConfig()
    assert set(record["stage_seconds"]) == set(study_stages(ran)) == set(record["stage_cpu_seconds"])
    sys.path.insert(0, str(BENCHMARKS.parents[1] / "benchmarks"))
    import real_model

    parts = record["part_seconds"]
    assert parts == real_model.part_seconds(record["stage_seconds"])
    assert parts["prediction stages"] == pytest.approx(sum(record["stage_seconds"][s] for s in PREDICTION_STAGES))
    assert sum(parts.values()) <= record["seconds"] <= sum(parts.values()) + 120
    assert all(run["study_yaml"] != record["study_yaml"] for run in record["superseded_runs"])
