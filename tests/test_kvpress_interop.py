"""posym's KV policy through NVIDIA's kvpress (issue 53's interop): the recipe of docs/commands/models.md makes
kvpress's DuoAttentionPress hide exactly the keys posym's policy hides from the prompt's last query.

kvpress 0.5.5 pins transformers < 5.3 and pandas < 3, which posym cannot share, so this test builds its own
environment and is skipped unless asked for:

    POSYM_KVPRESS_ENV=$HOME/.cache/posym/kvpress-env pytest tests/test_kvpress_interop.py

The directory is a virtual environment created there on first use (kvpress 0.5.5, torch 2.13.0, the
transformers kvpress allows; a few minutes, from the package index) and reused after. The tiny model is
written by posym's transformers as safetensors and read by kvpress's; the policy by `posym kv-policy`'s
writer; the press is the docs' recipe, run as written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = os.environ.get("POSYM_KVPRESS_ENV")
KVPRESS = "kvpress==0.5.5"
REQUIREMENTS = [KVPRESS, "torch==2.13.0", "transformers<5.3"]
"""What the environment installs: kvpress with the torch posym pins and the transformers kvpress allows."""

pytestmark = pytest.mark.skipif(not ENV, reason="set POSYM_KVPRESS_ENV to a directory to build kvpress's environment")


def kvpress_python() -> Path:
    """The environment's python, created and installed on first use (a marker file says it is complete)."""
    env = Path(ENV)
    python = env / "bin" / "python"
    done = env / "posym-kvpress.json"
    if not done.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
        done.write_text(json.dumps({"requirements": REQUIREMENTS}))
    return python


def recipe() -> str:
    """The kvpress recipe's code block in docs/commands/models.md, as written."""
    text = (ROOT / "docs" / "commands" / "models.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    found = [b for b in blocks if "class PosymPress(DuoAttentionPress)" in b]
    assert len(found) == 1, "docs/commands/models.md holds one kvpress recipe"
    return found[0]


PROBE = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, DynamicCache

model_dir, policy_dir, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
press = posym_press(policy_dir)
ids = torch.arange(length)[None] % (model.config.vocab_size - 1) + 1
with torch.no_grad(), press(model):
    model(ids, past_key_values=DynamicCache())
hidden = []
for layer in model.model.layers:
    found = getattr(layer.self_attn, "masked_key_indices", None)
    if found is None:
        continue
    batch, head, key = (t.tolist() for t in found)
    hidden += [[layer.self_attn.layer_idx, h, k] for b, h, k in zip(batch, head, key) if b == 0]
print(json.dumps({"hidden": sorted(hidden), "streaming": press.streaming_mask.int().tolist()}))
"""


@pytest.mark.parametrize("streaming", [0.25, 0.5, 1.0])
def test_kvpress_hides_what_posym_hides_at_the_prompts_last_query(tmp_path, streaming):
    import pandas as pd
    import torch
    from tiny_models import tiny_model

    from posym.commands.kv_policy import write_kv_policy
    from posym.core import kvpolicy

    python = kvpress_python()
    model = tiny_model("llama", dtype=torch.float32, positions=128)
    model.save_pretrained(tmp_path / "model")
    config = model.config
    rng = np.random.default_rng(0)
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    table = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(n_layers), n_heads),
            "head": np.tile(np.arange(n_heads), n_layers),
            "s_pos": rng.random(n_layers * n_heads),
            "s_sym": rng.random(n_layers * n_heads),
        }
    )
    table.to_parquet(tmp_path / "heads.parquet", index=False)
    sink, recent, length = 2, 8, 40
    write_kv_policy(
        config,
        tmp_path / "policy",
        policy="posym",
        streaming=streaming,
        table_path=tmp_path / "heads.parquet",
        sink=sink,
        recent=recent,
    )
    script = tmp_path / "probe.py"
    script.write_text(recipe() + PROBE)
    done = subprocess.run(
        [str(python), str(script), str(tmp_path / "model"), str(tmp_path / "policy"), str(length)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen_by_kvpress = json.loads(done.stdout.strip().splitlines()[-1])
    policy = kvpolicy.policy_from_table("posym", config, streaming, table=table, sink=sink, recent=recent)
    assert np.array_equal(np.array(seen_by_kvpress["streaming"], dtype=bool), ~policy.full)
    last = length - 1
    keys = np.arange(length)
    posym_hidden = sorted(
        [layer, head, int(j)]
        for layer in range(n_layers)
        for head in range(policy.n_kv_heads)
        if not policy.full[layer, head]
        for j in keys[~kvpolicy.visible(last, keys, sink=sink, recent=recent, window=None)]
    )
    assert seen_by_kvpress["hidden"] == posym_hidden
    assert len(posym_hidden) == int((~policy.full).sum()) * (length - sink - recent)  # something is hidden
