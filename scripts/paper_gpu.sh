#!/usr/bin/env bash
# Train the `paper` preset on both tasks on one GPU (concurrently), analyse them with
# scripts/paper_analysis.sh (dynamics, geometry, length generalization, theory, report) and pack the
# results (no intermediate checkpoints: ~10 MB each) into $OUT/<task>.tgz and $OUT/report.tgz. Usage: OUT=dir bash scripts/paper_gpu.sh [train-timeout-s]
# The GPU image has transformers 5.17, which lacks what posym needs (GPT-J SDPA, the rope kwargs the
# score hooks read): carry the pinned release as a wheel, fetched here with
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: -d .whl transformers==5.24.0
# and name `.whl` in the device call's carry list.
set -u
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
OUT=${OUT:-runs/paper-gpu-out}; LOG=runs/paper/logs; mkdir -p "$OUT" "$LOG"
T=${1:-420}
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
for task in number letter; do
  timeout "$T" python3 -m posym.cli train --preset paper --task $task --device cuda --out runs/paper/$task \
    > "$LOG/train-$task.log" 2>&1 &
done
wait
for task in number letter; do tail -3 "$LOG/train-$task.log"; done
POSYM="python3 -m posym.cli" timeout 600 bash scripts/paper_analysis.sh runs/paper cuda
for task in number letter; do
  last=$(ls -d runs/paper/$task/checkpoints/step-* | sort | tail -1)
  # every file of the run but the checkpoints, plus the final weights (config.json, model.safetensors)
  find runs/paper/$task -path '*/checkpoints' -prune -o -type f -print > /tmp/files-$task
  ls "$last"/config.json "$last"/model.safetensors "$last"/posym.json >> /tmp/files-$task
  tar czf "$OUT/$task.tgz" -T /tmp/files-$task "$LOG"/*-$task.log
done
tar czf "$OUT/report.tgz" runs/paper/theory runs/paper/report "$LOG"/theory.log "$LOG"/report.log
ls -la "$OUT"
