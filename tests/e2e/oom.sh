#!/usr/bin/env bash
# Out of memory is an error, not an abort: with the address space capped (ulimit -v), a model
# whose state does not fit gives one "shardgpt: error: out of host memory allocating <what>
# (<bytes>)" line with a hint, a non-zero exit on every rank, and no hang; `eval` with a
# micro-batch whose logits do not fit (vocabulary 50,257, B = 65536) says so in one line naming
# --micro-batch and what to change, on 2 ranks, instead of an uncaught DeviceOutOfMemory.
set -u
BIN=$1
# AddressSanitizer reserves terabytes of shadow address space at start-up, which no address-
# space cap leaves room for, and it reports a failed `new` itself instead of throwing.
if [ -n "${ASAN_OPTIONS:-}" ]; then echo "SKIP: an address-space cap cannot coexist with AddressSanitizer"; exit 77; fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 200) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
out=$(ulimit -v 4000000; timeout 120 mpirun -np 2 --oversubscribe "$BIN" train --model d24 --data "$T/data/train.bin" \
      --seq-len 1024 --micro-batch 8 --steps 1 --threads 1 2>&1); rc=$?
echo "$out" | grep '^shardgpt: error:'
n=$(grep -c '^shardgpt: error: out of host memory allocating .*([0-9]* bytes); try a higher --zero-stage' <<<"$out")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && [ "$(grep -c '^shardgpt: error:' <<<"$out")" -eq 1 ] \
  || { echo "FAIL: rc=$rc, $n out-of-memory lines"; echo "$out" | head -8; exit 1; }
echo "ok   train: one out-of-memory line"

# eval with a micro-batch whose logits cannot fit (GPT-2's vocabulary, B=65536): one line naming
# the micro-batch and what to change, on every rank, a non-zero exit, no abort trace
"$BIN" train --data "$T/data/train.bin" --n-layer 1 --n-embd 32 --n-head 2 --vocab-size 50257 --seq-len 16 \
  --micro-batch 2 --steps 1 --save-model "$T/v.bin" --quiet >/dev/null || { echo "FAIL: could not make the model"; exit 1; }
out=$(ulimit -v 4000000; timeout 120 mpirun -np 2 --oversubscribe "$BIN" eval "$T/v.bin" --data "$T/data/train.bin" \
      --seq-len 16 --micro-batch 65536 --threads 1 2>&1); rc=$?
echo "$out" | grep '^shardgpt: error:'
n=$(grep -c '^shardgpt: error: eval: out of host memory .* for --micro-batch 65536 x --seq-len 16 (the logits alone are .*give a smaller --micro-batch' <<<"$out")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 134 ] && [ "$n" -eq 1 ] && [ "$(grep -c '^shardgpt: error:' <<<"$out")" -eq 1 ] \
  && ! grep -q 'terminate called' <<<"$out" \
  || { echo "FAIL: eval: rc=$rc, $n out-of-memory lines"; echo "$out" | head -8; exit 1; }
echo "ok   eval: one out-of-memory line"
