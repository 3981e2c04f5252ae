#!/usr/bin/env bash
# A diverging run (--lr 1e9) stops at the first non-finite loss or gradient norm on every rank,
# with one error line and a non-zero exit, and never saves or publishes that state: with
# --ckpt-every 1 --keep-last 1, `latest` still names the last finite step and verifies.
set -u
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 400) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
out=$(timeout 120 mpirun -np 2 --oversubscribe "$BIN" train --data "$T/data/train.bin" --seq-len 16 --micro-batch 2 \
      --steps 20 --lr 1e9 --warmup-steps 0 --ckpt-dir "$T/ck" --ckpt-every 1 --keep-last 1 --quiet 2>&1); rc=$?
echo "$out" | grep '^shardgpt: error:'
fail=0
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: rc=$rc (expected a non-zero exit, no timeout)"; fail=1; }
[ "$(grep -c '^shardgpt: error: training diverged at step' <<<"$out")" -eq 1 ] || { echo "FAIL: expected one divergence line"; echo "$out" | head; fail=1; }
step=$(grep -o 'diverged at step [0-9]*' <<<"$out" | grep -o '[0-9]*$')
latest=$(readlink "$T/ck/latest" || cat "$T/ck/latest" 2>/dev/null)
echo "diverged at step $step; latest -> $latest"
[ -n "$step" ] && [ "$step" -ge 2 ] || { echo "FAIL: divergence step '$step'"; fail=1; }
want=$(printf 'step_%08d' $((step - 1)))
[[ "$latest" == *"$want"* ]] || { echo "FAIL: latest is '$latest', expected $want (the last finite step)"; fail=1; }
"$BIN" ckpt verify "$T/ck" >/dev/null || { echo "FAIL: the last finite checkpoint does not verify"; fail=1; }
ls "$T/ck" | grep -q "$(printf 'step_%08d' "$step")" && { echo "FAIL: the diverged step was saved"; fail=1; }
exit $fail
