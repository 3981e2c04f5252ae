#!/bin/bash
# plan's predicted peak vs the peak_bytes a real run logs (max over its steps), 2 ranks
BIN=${1:?usage: peak_vs_plan.sh SHARDGPT DATA_DIR (a prepared byte-level data dir)}
DATA=${2:?usage: peak_vs_plan.sh SHARDGPT DATA_DIR}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { # name model-flags -- train flags
  local name=$1; shift
  local stage=$1 dtype=$2; shift 2
  rm -f "$T/l.jsonl"
  mpirun -np 2 --oversubscribe $BIN train --data "$DATA/train.bin" "$@" --zero-stage $stage --dtype $dtype --steps 2 --threads 1 --quiet --log "$T/l.jsonl" >/dev/null 2>"$T/err.txt" || { echo "$name FAILED"; cat "$T/err.txt"; return; }
  meas=$(python3 -c "import json;print('%.3f' % (max(json.loads(l)['peak_bytes'] for l in open('"$T/l.jsonl"'))/1048576))")
  pred=$($BIN plan --ranks 2 "$@" --zero-stage $stage --dtype $dtype | awk -v s="*$stage" '$1==s {print $12}')
  echo "$name stage $stage $dtype: measured $meas MiB, plan $pred MiB"
}
for st in 0 1 2 3; do for dt in fp32 bf16; do
  run "L4 C256 V256 -b4 -t64" $st $dt --model tiny --n-layer 4 --n-head 4 --n-embd 256 -b 4 -t 64
done; done
for st in 1 2 3; do for dt in fp32 bf16; do
  run "L4 C128 V50257 -b1 -t32" $st $dt --model tiny --n-layer 4 --n-head 4 --n-embd 128 --vocab-size 50257 --max-seq-len 32 -b 1 -t 32
done; done
