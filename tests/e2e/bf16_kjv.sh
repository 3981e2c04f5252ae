#!/usr/bin/env bash
# bf16 compute end to end, on the demo's data and model (scripts/demo.sh: King James Bible,
# byte-level, L4 H4 C128 T128, 2 ranks x B8, ZeRO stage 1, lr 3e-3), 200 steps:
#  - `--dtype bf16 --compute-dtype bf16` (bf16 storage and bf16 matmuls) ends within 0.05 of
#    the fp32 run's validation loss (about 2% of it; the test prints the difference), and its
#    per-step losses are not the fp32 ones (the bf16 kernels really ran);
#  - the start-up says which compute runs in exactly one `compute:` line, as the CPU decides:
#    with --dtype bf16 alone, bf16 matmuls on a CPU with avx512_bf16/amx_bf16, else fp32.
# About 2 x 15 s on 2 idle cores (the bf16 run here uses the emulated kernels unless the CPU
# has AVX-512).
set -euo pipefail
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
command -v bible >/dev/null || { echo "bf16_kjv: needs Debian's bible-kjv (scripts/install-deps.sh)"; exit 1; }
bible -f Gen1:1-Rev22:21 > "$T/kjv.txt"
"$BIN" prepare --input "$T/kjv.txt" --output "$T/kjv" >/dev/null
run() {  # run LOGFILE [flags]
  local log=$1; shift
  mpirun -np 2 --oversubscribe "$BIN" train --data "$T/kjv/train.bin" --val-data "$T/kjv/val.bin" \
    --model tiny --n-layer 4 --n-head 4 --n-embd 128 --max-seq-len 128 --seq-len 128 \
    --micro-batch 8 --grad-accum 1 --lr 3e-3 --warmup-steps 30 --zero-stage 1 --threads 1 --log "$log" "$@"
}
# the start-up line, as the CPU decides (one step is enough)
out=$(run "$T/probe.jsonl" --steps 1 --dtype bf16)
n=$(grep -c '^compute: ' <<<"$out" || true)
[ "$n" = 1 ] || { echo "expected one 'compute:' start-up line, got $n:"; echo "$out"; exit 1; }
line=$(grep '^compute: ' <<<"$out")
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then want='^compute: bf16 matmuls'; else want='^compute: fp32'; fi
grep -qE "$want" <<<"$line" || { echo "start-up line '$line' does not match this CPU (want $want)"; exit 1; }
echo "$line"
# --dtype fp32 prints no compute line
out=$(run "$T/probe32.jsonl" --steps 1)
! grep -q '^compute: ' <<<"$out" || { echo "--dtype fp32 printed a compute line"; exit 1; }

run "$T/fp32.jsonl" --steps 200 --eval-every 200 --quiet
out=$(run "$T/bf16.jsonl" --steps 200 --eval-every 200 --dtype bf16 --compute-dtype bf16)
grep '^compute: ' <<<"$out"
/usr/bin/python3 - "$T/fp32.jsonl" "$T/bf16.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 200, (len(a), len(b))
va, vb = a[-1]["val_loss"], b[-1]["val_loss"]
print("val loss after 200 steps: fp32 %.4f, bf16 compute %.4f, difference %+.4f (band 0.05)" % (va, vb, vb - va))
assert va < 3.0, "fp32 run did not learn: %.4f" % va
assert abs(vb - va) <= 0.05, "bf16 compute outside the band: %.4f vs %.4f" % (vb, va)
assert [r["loss"] for r in a] != [r["loss"] for r in b], "bf16 compute gave the fp32 losses"
PY
echo "bf16 kjv ok"
