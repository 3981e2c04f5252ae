#!/usr/bin/env bash
# A straggling host left out of a running job, on the two-host cluster of tests/slurm/
# multinode.sh (hosts h1, h2 made of network namespaces, one rank each): a 2-node job of
# slurm/train_cpu.sbatch with SHARDGPT_TEST_SLOW=1:forward:300 in its environment (rank 1, on
# h2, sleeps 300 ms in every forward: named whatever the machine's speed; threshold 0.3 as in
# tests/e2e/stragglers.sh), --straggler-every 5 --straggler-exclude-after 2:
#   - the reports of steps 5 and 10 name rank 1 on host h2; the trainer writes h2 to
#     ckpt/exclude_hosts, checkpoints at step 10 and exits 76;
#   - the template resumes at once, in the same job, on h1 alone (one rank: the checkpoint
#     saved by 2 ranks reshards; --batch-tokens keeps the global batch, grad-accum 2);
#   - the job COMPLETES (0:0, no requeue); every step is logged once, steps 1..10 bitwise equal
#     to an uninterrupted `mpirun -np 2` run with the same flags, steps 11..N within 1e-5.
# 2. The watchdog's verdict: rank 1 (h2) hangs at step 13 (SHARDGPT_TEST_FAULT=skip), rank 0's
#    --comm-timeout 5 names it and records h2, the job's step fails; the template resumes from
#    the checkpoint of step 10 (--ckpt-every 5) on h1 alone; the same checks.
# Usage: tests/slurm/straggler_exclude.sh BUILD/shardgpt [SOURCE_DIR]. Root only (exit 77
# otherwise). Every wait is bounded; a watchdog ends it after 10 minutes.
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: starts Slurm daemons and network namespaces: run as root"; exit 77; fi
source "$SRC/tests/slurm/cluster.sh"
slurm_install || { echo "FAIL: cannot install slurm-wlm"; exit 1; }
netns_tools

# shared storage outside /tmp (each host has its own /tmp), the binary too
slurm_work_dir /var/tmp/shardgpt-slurm-sx.XXXXXX || fail "mktemp"
cp "$BIN" "$T/shardgpt" && BIN=$T/shardgpt
netns_pick_prefix
extra_cleanup() { netns_hosts_down "$P" 2; }
slurm_test_scaffold "$T" "$C" 600

t0=$SECONDS
netns_cluster_up "$T" "$C" 1 || fail "two-host cluster"
echo "cluster up in $((SECONDS - t0)) s: $(sinfo -h -N -o '%N/%t' | tr '\n' ' ')"

for i in $(seq 1 300); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || fail prepare
N=60
# --batch-tokens: 12 sequences of 64 per step whatever the rank count (2 ranks: 6 each; 1: 2 x 6)
A="--data $T/data/train.bin --seq-len 64 --n-layer 2 --n-embd 64 --n-head 4 --steps $N --lr 3e-3 --seed 5 --quiet
   --micro-batch 6 --batch-tokens 768 --zero-stage 1 --straggler-every 5 --straggler-threshold 0.3"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
  mpirun -np 2 --oversubscribe "$BIN" train $A --threads 1 --log "$T/ref.jsonl" >/dev/null || fail "mpirun reference"

id=$(SHARDGPT_TEST_SLOW=1:forward:300 sbatch_cpu sx -N 2 --ntasks=2 -- $A --straggler-exclude-after 2) || fail sbatch
wait_job "$id" 400 || { show "$T/sx.out" 40; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
[ "$(job_field "$id" Restarts)" = 0 ] || fail "job $id: Restarts=$(job_field "$id" Restarts), expected 0"
[ "$(cat "$T/sx/ckpt/exclude_hosts")" = h2 ] || { show "$T/sx.out" 40; fail "exclude_hosts holds '$(cat "$T/sx/ckpt/exclude_hosts" 2>&1)', expected h2"; }
for want in "run: job $id restart 0, .* 2 node(s) h\[1-2\], 2 task(s)" \
            "^shardgpt: straggler: rank 1 on host h2, phase forward, score .* over steps 2-5 " \
            "^shardgpt: straggler: rank 1 on host h2, phase forward, score .* over steps 6-10 " \
            "^straggler: host h2 named in 2 reports in a row (--straggler-exclude-after): recorded in $T/sx/ckpt/exclude_hosts; checkpointing at step 10 and exiting (status 76)" \
            "run: host recorded in $T/sx/ckpt/exclude_hosts (exit 76): resuming on the other node(s) of job $id" \
            "run: leaving out h2 ($T/sx/ckpt/exclude_hosts): 1 node(s) h1, 1 task(s)" \
            "resumed from .*step_00000010 at step 10 .* on 1 rank(s), zero stage 1 (saved by 2 rank(s)" \
            "final train loss"; do
  grep -q -- "$want" "$T/sx.out" || { show "$T/sx.out" 40; fail "'$want' not in the output"; }
done
[ "$(grep -c "straggler: rank" "$T/sx.out")" = 2 ] || { show "$T/sx.out" 40; fail "a straggler named after the exclusion"; }
check_losses "$T/sx/train.jsonl" 1 10 1e-5 || { show "$T/sx.out"; fail "losses"; }
echo "1. straggler: h2 named at steps 5 and 10, recorded, checkpoint at 10, exit 76; resumed on h1 alone" \
     "(1 rank, same global batch), COMPLETED 0:0 [$((SECONDS - t0)) s]"

# ---- 2. the watchdog's verdict: rank 1 (h2) hangs at step 13 ----
id=$(SHARDGPT_TEST_FAULT=skip:1:13 sbatch_cpu wd -N 2 --ntasks=2 -- $A --straggler-exclude-after 2 --comm-timeout 5 --ckpt-every 5) || fail sbatch
wait_job "$id" 400 || { show "$T/wd.out" 40; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
[ "$(cat "$T/wd/ckpt/exclude_hosts")" = h2 ] || { show "$T/wd.out" 40; fail "exclude_hosts holds '$(cat "$T/wd/ckpt/exclude_hosts" 2>&1)', expected h2"; }
for want in "^shardgpt: error: rank 0: .* step 13) made no progress for 5 s (--comm-timeout): .*\(culprit rank(s) 1:\|rank(s) 1 did not arrive\)" \
            "^shardgpt: rank 0: the watchdog's verdict names host h2: recorded in $T/wd/ckpt/exclude_hosts" \
            "run: host recorded in $T/wd/ckpt/exclude_hosts (exit [0-9]*): resuming on the other node(s) of job $id" \
            "run: leaving out h2 ($T/wd/ckpt/exclude_hosts): 1 node(s) h1, 1 task(s)" \
            "resumed from .*step_00000010 at step 10 .* on 1 rank(s), zero stage 1 (saved by 2 rank(s)" \
            "final train loss"; do
  grep -q -- "$want" "$T/wd.out" || { show "$T/wd.out" 40; fail "'$want' not in the output"; }
done
check_losses "$T/wd/train.jsonl" 1 10 1e-5 || { show "$T/wd.out"; fail "losses"; }
echo "2. watchdog: rank 1 on h2 hung at step 13, rank 0's verdict recorded h2; resumed from step 10 on h1 alone," \
     "COMPLETED 0:0 [$((SECONDS - t0)) s]"
