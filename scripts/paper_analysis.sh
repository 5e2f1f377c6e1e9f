#!/usr/bin/env bash
# Analyse the two `paper` preset runs in RUNS/number and RUNS/letter (trained by scripts/paper_gpu.sh
# or `posym train --preset paper [--stop-at STEP]`): dynamics, geometry, length generalization and
# discrepancy by length per task (the two tasks side by side, one thread each), the theory checks with Fig. 5A drawn at the
# number model's layer-2 weighted frequency ID (as the paper) and a symbolic layer's, and the report.
# Usage: bash scripts/paper_analysis.sh RUNS [device]    (writes RUNS/theory, RUNS/report, RUNS/logs)
set -eu
RUNS=${1:?usage: scripts/paper_analysis.sh RUNS [device]}; DEVICE=${2:-cpu}
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
POSYM=${POSYM:-posym}
mkdir -p "$RUNS/logs"
analyse() {  # one task: its three analyses, in order, each logged
  $POSYM dynamics "$RUNS/$1" > "$RUNS/logs/dynamics-$1.log" 2>&1
  $POSYM geometry "$RUNS/$1" --device "$DEVICE" > "$RUNS/logs/geometry-$1.log" 2>&1
  $POSYM lengthgen "$RUNS/$1" --device "$DEVICE" > "$RUNS/logs/lengthgen-$1.log" 2>&1
  $POSYM discrepancy "$RUNS/$1" --device "$DEVICE" > "$RUNS/logs/discrepancy-$1.log" 2>&1
}
analyse number & a=$!
analyse letter & b=$!
wait $a && wait $b
# Fig. 5A at trained frequencies: the number model's layer 2 (the paper's choice) and its last layer
ids=$(python3 -c "
import json, sys
ids = json.load(open(sys.argv[1]))['weighted_id_per_layer']
print(' '.join(f'--curve-freq-id {max(1, round(i))}' for i in (ids[2], ids[-1])))" "$RUNS/number/analysis/geometry.json")
$POSYM theory --out "$RUNS/theory" $ids > "$RUNS/logs/theory.log" 2>&1
$POSYM report "$RUNS/number" "$RUNS/letter" "$RUNS/theory" --out "$RUNS/report" \
  --title "posym: the paper preset" > "$RUNS/logs/report.log" 2>&1
tail -n 3 "$RUNS"/logs/*.log
