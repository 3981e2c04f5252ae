#!/usr/bin/env bash
# shardgpt data parallel against PyTorch DDP (gloo), side by side (a benchmark: it prints figures,
# it asserts nothing). For each config, ROUNDS times alternately: `mpirun -np RANKS bench_train
# --threads 1` at ZeRO stage 0, the same at stage 3, then bench/torch_ddp.py (the same model and
# step under torch DistributedDataParallel over gloo, RANKS processes x 1 thread), each with the
# config's per-rank micro-batch (tiny, small: B8 T256). Prints every triple, then per config the
# medians of the job's tokens/s and the median of the per-round ratios shardgpt / PyTorch DDP.
#   bench/vs_torch_ddp.sh [build-dir]     env: ROUNDS=3 STEPS=10 CONFIGS="tiny small" RANKS=2
# Needs Debian's python3-torch for /usr/bin/python3 (bench only; never a test dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-10} CONFIGS=${CONFIGS:-"tiny small"} RANKS=${RANKS:-2}
PY=/usr/bin/python3
"$PY" -c "import torch" 2>/dev/null || { echo "vs_torch_ddp: needs python3-torch for $PY (apt-get install python3-torch)"; exit 1; }
[ -x "$BUILD/bench/bench_train" ] || { echo "vs_torch_ddp: build $BUILD/bench/bench_train first (scripts/build.sh)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench/machine.sh
echo "torch $("$PY" -c 'import torch; print(torch.__version__)'); $RANKS ranks x 1 thread; $STEPS steps (2 warm-up), medians"
tokens() { grep -o '[0-9]* tokens/s' <<<"$1" | head -1 | cut -d' ' -f1; }
results=$(mktemp); trap 'rm -f "$results"' EXIT
for config in $CONFIGS; do
  for r in $(seq 1 "$ROUNDS"); do
    s0=$(mpirun -np "$RANKS" --oversubscribe "$BUILD"/bench/bench_train --config "$config" --threads 1 --steps "$STEPS" --zero-stage 0)
    s3=$(mpirun -np "$RANKS" --oversubscribe "$BUILD"/bench/bench_train --config "$config" --threads 1 --steps "$STEPS" --zero-stage 3)
    t=$(OMP_WAIT_POLICY=PASSIVE "$PY" bench/torch_ddp.py --config "$config" --ranks "$RANKS" --threads 1 --steps "$STEPS")
    a=$(tokens "$s0") b=$(tokens "$s3") c=$(tokens "$t")
    echo "$config round $r: shardgpt stage 0 $a tok/s | stage 3 $b tok/s | PyTorch DDP gloo $c tok/s |" \
         "ratios $(awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN{printf "%.2f / %.2f", a/c, b/c}')"
    echo "$config $a $b $c" >> "$results"
  done
done
echo
"$PY" - "$results" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
print("| config | shardgpt stage 0 tok/s | shardgpt stage 3 tok/s | PyTorch DDP (gloo) tok/s | stage 0 / DDP | stage 3 / DDP |")
print("|---|---|---|---|---|---|")
for c in dict.fromkeys(r[0] for r in rows):
    g = [[float(x) for x in r[1:]] for r in rows if r[0] == c]
    med = lambda i: st.median(x[i] for x in g)
    ratio = lambda i: st.median(x[i] / x[2] for x in g)
    print(f"| {c} | {med(0):,.0f} | {med(1):,.0f} | {med(2):,.0f} | **{ratio(0):.2f}x** | **{ratio(1):.2f}x** "
          f"({len(g)} rounds) |")
PY
