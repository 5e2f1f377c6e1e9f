"""scripts/letter_gap.py on a tiny untrained GPT-J of the letter task: every condition it writes, and hide_all's
exactness (the extra keys hidden from every head give the training-length prompt's answer logits)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import letter_gap  # noqa: E402

from posym.configs import from_dict  # noqa: E402
from posym.core.model import ModelConfig, build_model  # noqa: E402
from posym.core.tasks import task_config  # noqa: E402


def test_conditions_and_the_exactness_of_hiding_every_extra_key():
    task = task_config("letter")
    config = from_dict(ModelConfig, dict(n_layer=3, n_head=1, n_embd=32, rotary_dim=32, dropout=0.0, n_positions=64))
    model = build_model(config, task.vocab_size, seed=3, attn_implementation="eager").eval()
    torch.set_grad_enabled(False)
    try:
        frame, ranking, exact = letter_gap.run_conditions(
            model, task, 40, n=24, draws=2, batch_tokens=4096, seed_label=7
        )
    finally:
        torch.set_grad_enabled(True)
    assert exact < 1e-5
    assert (frame.seed == 7).all() and (frame.length == 40).all() and (frame.n == 24).all()
    counts = frame.condition.value_counts()
    assert counts["none"] == 1 and counts["hide_all"] == 1
    assert counts["hide_one"] == counts["keep_one"] == 3 and len(ranking) == 3
    assert counts["hide_top"] == len(letter_gap.TOP) and counts["random_heads"] == 2 * len(letter_gap.TOP)
    planes = config.rotary_dim // 2  # 16: the groups up to ID 16 fit, 17-32 and 33-64 do not
    assert {c for c in counts.index if c.startswith("far_ids")} == {"far_ids1_8", "far_ids9_16"} and planes == 16
    assert counts["random_planes_1_8"] == counts["random_planes_9_16"] == 2
    hide_all = frame[frame.condition == "hide_all"].iloc[0]
    assert hide_all.heads == "L0,L1,L2"
    top = frame[frame.condition == "hide_top"].set_index("k").heads
    best = ranking.sort_values(["acc", "layer"], ascending=[False, True]).layer.tolist()
    assert top[1] == f"L{best[0]}" and top[2] == ",".join(f"L{layer}" for layer in sorted(best[:2]))
