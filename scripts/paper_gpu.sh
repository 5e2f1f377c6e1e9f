#!/usr/bin/env bash
# Train the `paper` preset on both tasks on one GPU (concurrently), then run dynamics, geometry and
# length generalization on the runs, and pack the results (no intermediate checkpoints: they are
# ~10 MB each) into $OUT/<task>.tgz. Usage: OUT=dir bash scripts/paper_gpu.sh [train-timeout-s]
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
OUT=${OUT:-runs/paper-gpu-out}; mkdir -p "$OUT"
T=${1:-170}
posym() { python3 -m posym.cli "$@"; }
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
for task in number letter; do
  timeout "$T" python3 -m posym.cli train --preset paper --task $task --device cuda --out runs/paper/$task \
    > "$OUT/train-$task.log" 2>&1 &
done
wait
for task in number letter; do
  tail -3 "$OUT/train-$task.log"
  timeout 45 python3 -m posym.cli dynamics runs/paper/$task > "$OUT/dyn-$task.log" 2>&1 &
  timeout 45 python3 -m posym.cli lengthgen runs/paper/$task --device cuda > "$OUT/lg-$task.log" 2>&1 &
done
wait
for task in number letter; do
  timeout 30 python3 -m posym.cli geometry runs/paper/$task > "$OUT/geo-$task.log" 2>&1 &
done
wait
for task in number letter; do
  last=$(ls -d runs/paper/$task/checkpoints/step-* | sort | tail -1)
  tar czf "$OUT/$task.tgz" --exclude='runs/paper/'$task'/checkpoints' runs/paper/$task \
    "$last/config.json" "$last/model.safetensors" "$OUT"/*-$task.log 2>/dev/null
done
ls -la "$OUT"
