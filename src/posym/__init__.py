"""posym: positional versus symbolic attention heads in RoPE transformers.

Implements the study of arXiv 2605.31558 (Urrutia et al., 2026) and the head metric of
arXiv 2511.11579: multi-hop tasks, GPT-J training, exact head scores, RoPE geometry, theory,
length generalization and the same analysis on real Hugging Face models.
"""

import os

# torch's OpenMP threads spin-wait by default, which makes the many small ops of a tiny model
# 5-20x slower on a 2-core machine; passive waiting must be chosen before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
