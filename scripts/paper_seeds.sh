#!/usr/bin/env bash
# The paper's study at its own scale over seeds (issue 18; docs/results.md, "How to finish the
# paper-scale study"): the `paper` preset to step 6,000 with checkpoints every 250 for seeds 0, 1, 2
# on both tasks (six runs) and the `seed` preset (6 layers x 8 heads) once per task, then per run:
#   validate                 validation accuracy per checkpoint, best step by validation
#   dynamics                 scores per checkpoint, all hops and per pointer role, purity, Fig. 2/6/7
#   geometry                 per-plane use, Table 1 under every weighting (last checkpoint)
#   lengthgen                480 questions per length up to 2,048 tokens, at the last checkpoint
#   lengthgen --step best    the same at the best checkpoint by validation (paper preset runs)
#   discrepancy              top-1 minus top-2 logit by length (paper preset runs)
# then `posym theory` once and one report per seed of the paper preset.
# PRESETS may also name issue 28's variants of the paper preset (scripts/paper_variants.py: authors,
# horizon, batch64, authors64, noid1): each trains RUNS/<variant>-s<seed>/<task> from its preset plus its config
# overrides, to its final step (horizon: step 6,000 of a 22,500-step schedule), analysed like the paper
# preset; collect them with `collect_paper_results.py RUNS --presets authors,... --out docs/results/paper-variants`.
#
# Idempotent and resumable: a run with a config.yaml is resumed from its latest checkpoint (never
# restarted), a finished run is not touched, and an analysis whose output file exists is skipped.
# Kill it at any time and run the same command again. Run directories are RUNS/paper-s<seed>/<task>
# and RUNS/seed-s0/<task>, the layout of the lead's ~/posym-runs/paper-s0/{number,letter}, whose
# runs (started before val_size existed) it resumes as they are: their validation accuracy is
# computed from the checkpoints by `posym validate`. Keep RUNS outside the work tree.
#
# Usage: bash scripts/paper_seeds.sh RUNS [cpu|cuda] [STOP_AT]
#   cpu (default): JOBS trainings at a time (default 2, one thread each), analyses after all.
#   cuda: all eight trainings at once on the one GPU (small models: minutes), then the analyses.
#   STOP_AT: train every run only up to this step in this session and stop (CPU pieces: e.g. 1500,
#            3000, 4500, then without STOP_AT to finish and analyse); the schedule stays the 6,000-step one.
# Environment: POSYM (command, default "python3 -m posym.cli" on this checkout's src/), JOBS,
# PRECISION (float32 default; bfloat16 autocast for new runs only, see docs/results.md), PRESETS (default "paper seed";
# "paper" trains and analyses only the paper-preset runs, e.g. to analyse finished seeds first), SEEDS (default
# "0 1 2"), TASKS (default: each preset's own; e.g. "letter" trains and analyses only those), N (questions per length, 480), LENGTHS, TRAIN_EXTRA (YAML lines added to both presets'
# config files, e.g. for a smoke test: 'max_steps: 8' -- the paper study itself leaves it empty).
# On the GPU machine, carry the pinned transformers wheel as scripts/paper_gpu.sh explains (.whl/).
set -euo pipefail
RUNS=${1:?usage: scripts/paper_seeds.sh RUNS [cpu|cuda] [STOP_AT]}; DEVICE=${2:-cpu}; STOP_AT=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/transformers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$ROOT"/.whl/*.whl
fi
[ -d /tmp/site/transformers ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH} OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
POSYM=${POSYM:-python3 -m posym.cli}; JOBS=${JOBS:-2}; PRECISION=${PRECISION:-float32}; SEEDS=${SEEDS:-0 1 2}
PRESETS=${PRESETS:-paper seed}
N=${N:-480}; LENGTHS=${LENGTHS:-17,34,51,68,128,256,512,850,1024,2048}; TRAIN_EXTRA=${TRAIN_EXTRA:-}
mkdir -p "$RUNS/logs"
threads=$([ "$DEVICE" = cuda ] && echo null || echo 1)
variant() { python3 "$ROOT/scripts/paper_variants.py" "$1" "$2"; }  # overrides|preset|final|tasks NAME
for preset in $PRESETS; do  # the paper preset checkpoints every 500 by default; the study wants 250
  { [ $preset != seed ] && echo "checkpoint_every: 250" && variant overrides "$preset" | sed 's/^{\(.*\)}$/\1/'
    printf 'threads: %s\nprecision: %s\ndevice: %s\n%s\n' "$threads" "$PRECISION" "$DEVICE" "$TRAIN_EXTRA"
  } > "$RUNS/$preset.yaml"
done

progress() {  # "<latest checkpoint step> <max_steps>" of a run directory ("-1 0" before it exists)
  python3 - "$1" <<'EOF'
import sys
from pathlib import Path
import yaml
from posym.models import list_checkpoints
run = Path(sys.argv[1])
if not (run / "config.yaml").is_file():
    print(-1, 0)
else:
    done = list_checkpoints(run)
    print(done[-1][0] if done else -1, yaml.safe_load((run / "config.yaml").read_text())["max_steps"])
EOF
}

train_run() {  # preset seed task: start or resume one run up to STOP_AT (or the end)
  local preset=$1 seed=$2 task=$3 dir="$RUNS/$1-s$2/$3" log="$RUNS/logs/train-$1-s$2-$3.log"
  read -r latest max_steps < <(progress "$dir")
  local start=$preset final=0
  if [ "$preset" != seed ]; then start=$(variant preset "$preset"); final=$(variant final "$preset"); fi
  local stop=${STOP_AT:-}  # this session's last step: STOP_AT, capped at a variant's final step
  if [ "$final" -gt 0 ] && { [ -z "$stop" ] || [ "$stop" -gt "$final" ]; }; then stop=$final; fi
  local end=$max_steps; [ "$final" -gt 0 ] && end=$final  # where the run counts as finished
  if [ "$latest" -ge 0 ] && { [ "$latest" -ge "$end" ] || { [ -n "$stop" ] && [ "$latest" -ge "$stop" ]; }; }; then
    return 0  # finished, or already at this session's stop
  fi
  if [ "$latest" -ge 0 ] || [ -f "$dir/config.yaml" ]; then
    $POSYM train --resume "$dir" ${stop:+--stop-at "$stop"} --no-progress >> "$log" 2>&1
  else
    $POSYM train --preset "$start" --task "$task" --seed "$seed" --config "$RUNS/$preset.yaml" --out "$dir" \
      ${stop:+--stop-at "$stop"} --no-progress >> "$log" 2>&1
  fi
}

RUN_LIST=()
for preset in $PRESETS; do
  if [ "$preset" = seed ]; then RUN_LIST+=("seed 0 number" "seed 0 letter"); continue; fi
  for seed in $SEEDS; do for task in $(variant tasks "$preset"); do
    case " ${TASKS:-$task} " in *" $task "*) RUN_LIST+=("$preset $seed $task");; esac  # TASKS: only these
  done; done
done

width=$([ "$DEVICE" = cuda ] && echo "${#RUN_LIST[@]}" || echo "$JOBS")
each_run() {  # function failure-message: `function preset seed task` for every run, `width` at a time
  local work=$1 status=0 pids=()
  for spec in "${RUN_LIST[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$width" ]; do wait -n || true; done
    $work $spec &
    pids+=($!)
  done
  # every job's status, also of those already finished (`jobs -r` lists only running ones; bash keeps the
  # status of each background pid for `wait PID`, even after `wait -n` reaped it)
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  [ "$status" = 0 ] || { echo "$2" >&2; exit 1; }
}

# ---- training: all runs (on CPU JOBS at a time) ------------------------------------------------------
each_run train_run "a training failed; see $RUNS/logs/train-*.log"
if [ -n "$STOP_AT" ]; then
  echo "every run is at step $STOP_AT (or finished); run again without STOP_AT to finish and analyse"
  exit 0
fi

# ---- analyses: each stage skipped when its output exists ---------------------------------------------
stage() {  # output-file log-name command...
  local output=$1 log="$RUNS/logs/$2.log"; shift 2
  [ -e "$output" ] && return 0
  "$@" > "$log" 2>&1
}
analyse() {  # preset seed task
  local dir="$RUNS/$1-s$2/$3" name="$1-s$2-$3"
  stage "$dir/validation.json" "validate-$name" $POSYM validate "$dir" --device "$DEVICE"
  stage "$dir/analysis/dynamics.json" "dynamics-$name" $POSYM dynamics "$dir"
  stage "$dir/analysis/geometry.json" "geometry-$name" $POSYM geometry "$dir" --device "$DEVICE"
  if [ "$1" != seed ]; then  # the paper preset and its variants: the paper protocol at last and best
    stage "$dir/lengthgen/lengthgen.json" "lengthgen-$name" $POSYM lengthgen "$dir" --n "$N" --lengths "$LENGTHS" \
      --device "$DEVICE"
    stage "$dir/lengthgen-best/lengthgen.json" "lengthgen-best-$name" $POSYM lengthgen "$dir" --step best --n "$N" \
      --lengths "$LENGTHS" --device "$DEVICE" --out "$dir/lengthgen-best"
    stage "$dir/discrepancy/discrepancy.json" "discrepancy-$name" $POSYM discrepancy "$dir" --lengths "$LENGTHS" \
      --device "$DEVICE"
  else  # the seed summary's protocol: 1x-4x the training length, retention
    stage "$dir/lengthgen/lengthgen.json" "lengthgen-$name" $POSYM lengthgen "$dir" --protocol seed --n "$N" \
      --device "$DEVICE"
  fi
}
each_run analyse "an analysis failed; see $RUNS/logs/"
stage "$RUNS/theory/theory.json" theory $POSYM theory --out "$RUNS/theory"
case " $PRESETS " in *" paper "*) ;; *) echo "done: per-run outputs under $RUNS/*/*/"; exit 0;; esac
for seed in $SEEDS; do
  stage "$RUNS/report-s$seed/report.html" "report-s$seed" $POSYM report "$RUNS/paper-s$seed/number" \
    "$RUNS/paper-s$seed/letter" "$RUNS/theory" --out "$RUNS/report-s$seed" --title "posym: paper preset, seed $seed"
done
echo "done: per-run outputs under $RUNS/*/*/{analysis,lengthgen,lengthgen-best,discrepancy}, reports $RUNS/report-s*"
