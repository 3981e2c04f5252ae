#!/usr/bin/env bash
# The NCCL watchdog (parallel/nccl/nccl_communicator.cc) under the CUDA emulation.
# 0. --comm-timeout counts from when a collective starts, not from when it was queued: on 1
#    rank (no peer to wait for), the first collective is queued behind compute that outlives a
#    1 s timeout by construction (SHARDGPT_TEST_NCCL_HOLD_COMPUTE_S=2: a host function on the
#    compute stream that returns only after 2 s and after the watchdog has seen the collective
#    in flight), and the run completes. The premise is asserted from the communicator's report
#    of that collective's wait to start (> the timeout), so no machine speed can make it vacuous.
# 1. An NCCL failure mid-run ends the job on every rank with one line, no hang: 2 ranks, --comm
#    nccl, the emulation's failure injection
# (SHARDGPT_NCCL_EMU_FAIL_AT=N: this process's N-th NCCL operation does not run and sets the
# communicator's asynchronous error, as a dead peer or a broken link would). Expected: exit
# status non-zero within the bound, "shardgpt: error: rank R: NCCL: asynchronous error" from
# each rank, no rank left running. Also: two ranks given the same GPU are refused, before NCCL
# starts, with one line naming both ranks and the GPU's bus id.
# Runs under the CUDA emulation only (a real NCCL has no injection): exits 77 elsewhere.
set -uo pipefail
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for i in $(seq 1 100); do echo "In the beginning God created the heaven and the earth."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || exit 1
MODEL="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --micro-batch 2 --threads 1"
probe=$("$BIN" train $MODEL --steps 1 --device cuda 2>&1)
if ! grep -q "CUDA emulation" <<<"$probe"; then
  echo "SKIP: not a CUDA-emulation build (the failure injection is the emulation's)"; exit 77
fi

# 0. compute longer than the timeout in front of a collective
out0=$(SHARDGPT_TEST_NCCL_HOLD_COMPUTE_S=2 timeout 300 "$BIN" train $MODEL --steps 2 --device cuda --comm nccl \
  --comm-timeout 1 2>&1) ||
  { echo "FAIL: a collective waiting behind compute was timed out"; echo "$out0"; exit 1; }
wait0=$(sed -n 's/^nccl watchdog: rank 0: the held collective waited \([0-9.]*\) s to start, watched.*/\1/p' <<<"$out0")
[ -n "$wait0" ] || { echo "FAIL: no report of the held collective's wait (the premise)"; echo "$out0"; exit 1; }
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$wait0') > 1 else 1)" ||
  { echo "FAIL: the held collective waited $wait0 s to start, not more than the 1 s timeout"; exit 1; }
echo "0. 1 s --comm-timeout, a collective queued behind $wait0 s of compute, watched meanwhile: completed"

# 1. the 40th NCCL operation of each rank fails (mid-run: a step has a dozen at stage 3)
start=$SECONDS
SHARDGPT_NCCL_EMU_FAIL_AT=40 timeout 300 mpirun -np 2 -x SHARDGPT_NCCL_EMU_FAIL_AT "$BIN" train $MODEL \
  --steps 50 --zero-stage 3 --device cuda --comm nccl --comm-timeout 60 --quiet >"$T/out" 2>&1
rc=$?
took=$((SECONDS - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: exit status $rc (124: hung)"; cat "$T/out"; exit 1; }
# Reported either by the watchdog (the collective's asynchronous error) or by the NCCL call that
# returned the error itself (which of the two depends on which operation the 40th is: since the
# step's loss and norm are summed over ranks by a device all-gather issued from the training
# thread, it is that all-gather, and ncclAllGather returns the error): one line per rank either way.
n=$(grep -cE "shardgpt: error: rank [01]: NCCL: (asynchronous error|nccl[A-Za-z]+ failed)" "$T/out")
[ "$n" -ge 1 ] || { echo "FAIL: no NCCL error line"; cat "$T/out"; exit 1; }
grep -q "emulated failure (SHARDGPT_NCCL_EMU_FAIL_AT)" "$T/out" || { echo "FAIL: the cause is not named"; cat "$T/out"; exit 1; }
pgrep -f "$T/data/train.bin" >/dev/null && { echo "FAIL: a rank is still running"; exit 1; }
echo "1. injected NCCL failure: exit $rc after $took s, $n rank error line(s): $(grep -m1 'shardgpt: error' "$T/out")"

# 2. both ranks on one GPU (CUDA_VISIBLE_DEVICES=3 for each): refused by bus id, every rank
CUDA_VISIBLE_DEVICES=3 timeout 120 mpirun -np 2 -x CUDA_VISIBLE_DEVICES "$BIN" train $MODEL --steps 2 \
  --device cuda --comm nccl --quiet >"$T/out2" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: shared GPU: exit status $rc"; cat "$T/out2"; exit 1; }
grep -q "ranks 0 and 1 on host .* share GPU 0000:13:00.0; NCCL needs one GPU per rank" "$T/out2" ||
  { echo "FAIL: shared GPU: unexpected output"; cat "$T/out2"; exit 1; }
echo "2. two ranks on one GPU: $(grep -m1 'shardgpt: error' "$T/out2")"
# ... and one GPU per rank chosen by CUDA_VISIBLE_DEVICES (as Slurm's per-task binding does) runs.
cat > "$T/bind.sh" <<EOF
#!/bin/bash
export CUDA_VISIBLE_DEVICES=\$((OMPI_COMM_WORLD_RANK + 5))
exec "$BIN" "\$@"
EOF
chmod +x "$T/bind.sh"
timeout 300 mpirun -np 2 "$T/bind.sh" train $MODEL --steps 2 --device cuda --comm nccl >"$T/out3" 2>&1 ||
  { echo "FAIL: one visible GPU per rank"; cat "$T/out3"; exit 1; }
grep -q "bus 0000:15:00.0" "$T/out3" && grep -q "bus 0000:16:00.0" "$T/out3" ||
  { echo "FAIL: the ranks did not report GPUs 5 and 6"; cat "$T/out3"; exit 1; }
echo "3. CUDA_VISIBLE_DEVICES=5 and =6 (one visible GPU each): trains; $(grep -m1 'bus 0000:15' "$T/out3")"
echo "nccl_watchdog: ok"
