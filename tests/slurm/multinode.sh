#!/usr/bin/env bash
# Several Slurm nodes on one machine: two hosts made of network namespaces (tests/slurm/
# cluster.sh netns_hosts_up: a bridge, a veth pair each, their own hostname h1/h2, address and
# /tmp), one slurmd per host, slurmctld and munged in the root namespace. Jobs run
# slurm/train_cpu.sbatch with one rank per node, so srun's PMIx wire-up and the MPI traffic of
# training cross the bridge over TCP:
#   1. a 2-node step runs task 0 on h1 and task 1 on h2, each with its own address;
#   2. a 2-node training job (one rank per node) has the losses of `mpirun -np 2` on one node,
#      bitwise, and at least the bytes its communication ledger counts crossed h1's link;
#   3. a 2-node job preempted twice (scancel --signal=USR1, while held at known steps): requeued
#      and resumed on 2 nodes (bitwise), then, after the second stop, cancelled while pending and resubmitted on ONE
#      node with the same run directory: it resumes on 1 rank (grad-accum 2, same global batch
#      via --batch-tokens) within 1e-3; every step logged once.
# Usage: tests/slurm/multinode.sh BUILD/shardgpt [SOURCE_DIR]. Root only (exit 77 otherwise).
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: starts Slurm daemons and network namespaces: run as root"; exit 77; fi
source "$SRC/tests/slurm/cluster.sh"
slurm_install || { echo "FAIL: cannot install slurm-wlm"; exit 1; }
netns_tools

# Shared storage of the "cluster" outside /tmp (each host has its own /tmp).
slurm_work_dir /var/tmp/shardgpt-slurm-mn.XXXXXX || fail "mktemp"
# The binary too: the build may itself live under /tmp (a CI clone), which the hosts cannot see.
cp "$BIN" "$T/shardgpt" && BIN=$T/shardgpt
# a name prefix and a /24 no interface here uses yet
netns_pick_prefix
extra_cleanup() { netns_hosts_down "$P" 2; }
slurm_test_scaffold "$T" "$C" 840

t0=$SECONDS
netns_cluster_up "$T" "$C" 1 || fail "two-host cluster"
echo "cluster up in $((SECONDS - t0)) s: controller on $NET.1 (bridge $P-br); $(sinfo -h -N -o '%N/%t' | tr '\n' ' ')"

# ---- 1. one task per host-namespace ----
id=$(sbatch --parsable -N 2 --ntasks=2 --output="$T/hosts.out" --wrap \
  'srun sh -c "echo task \$SLURM_PROCID on \$(hostname) \$(ip -4 -o addr show eth0 | tr -s \" \" | cut -d\" \" -f4)"') || fail sbatch
wait_job "$id" 60 || fail "hosts job"
expect_job "$id" COMPLETED 0:0
grep -q "^task 0 on h1 $NET.11/24$" "$T/hosts.out" && grep -q "^task 1 on h2 $NET.12/24$" "$T/hosts.out" \
  || { show "$T/hosts.out"; fail "tasks not on h1 and h2"; }
echo "1. srun -N 2: $(sort "$T/hosts.out" | tr '\n' ';')"

# ---- data, flags, the reference (mpirun -np 2 on this one host, shared memory) ----
for i in $(seq 1 300); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || fail prepare
N=150
# --batch-tokens: 12 sequences of 64 per step whatever the rank count (2 ranks: 6 each; 1: 2 x 6)
A="--data $T/data/train.bin --seq-len 64 --n-layer 2 --n-embd 64 --n-head 4 --steps $N --lr 3e-3 --seed 5 --quiet --micro-batch 6 --batch-tokens 768 --zero-stage 1"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
  mpirun -np 2 --oversubscribe "$BIN" train $A --threads 1 --log "$T/ref.jsonl" >/dev/null || fail "mpirun reference"

# ---- 2. training across the two hosts ----
link=/sys/class/net/$P-v1/statistics
b0=$(( $(cat "$link/rx_bytes") + $(cat "$link/tx_bytes") ))
id=$(sbatch_cpu two -N 2 --ntasks=2 -- $A) || fail sbatch
wait_job "$id" 300 || { show "$T/two.out"; fail "job $id did not end"; }
b1=$(( $(cat "$link/rx_bytes") + $(cat "$link/tx_bytes") ))
expect_job "$id" COMPLETED 0:0
grep -q "2 node(s) h\[1-2\], 2 task(s)" "$T/two.out" || { show "$T/two.out"; fail "not on h1 and h2"; }
check_losses "$T/two/train.jsonl" 1 $N 1e9 || { show "$T/two.out"; fail "2-node job vs mpirun"; }
ledger=$(/usr/bin/python3 -c "import json,sys; print(sum(sum(json.loads(l)['comm_bytes_per_rank']) for l in open(sys.argv[1])))" "$T/two/train.jsonl")
[ $((b1 - b0)) -ge "$ledger" ] || fail "only $((b1 - b0)) bytes crossed h1's link, the ledger counts $ledger sent"
echo "2. 2 nodes x 1 rank: COMPLETED, losses bitwise equal to mpirun -np 2 on one host;" \
     "$((b1 - b0)) bytes crossed h1's link (ledger: $ledger sent by the two ranks) [$((SECONDS - t0)) s]"

# ---- 3. preempted on 2 nodes, requeued on 2, preempted again, resubmitted on 1 ----
# Held at the boundaries after steps S1 and S2 until the signal has come (SHARDGPT_TEST_HOLD_AT_STEP:
# the fresh run holds at S1, the run resumed from S1 at S2): where each stop lands does not depend
# on how fast steps run against the signal's delivery (a race of the two can go either way).
S1=$((N / 4)) S2=$((N / 2))
holds() { cat "$T/pre.out" 2>/dev/null | grep -c "test hook: holding at the step boundary"; }
wait_holds() {  # wait_holds K: the K-th hold printed (starting requeued runs meanwhile)
  for _ in $(seq 1 2400); do start_requeued "$id"; [ "$(holds)" -ge "$1" ] && return 0; sleep 0.1; done
  return 1
}
id=$(SHARDGPT_TEST_HOLD_AT_STEP=$S1,$S2 sbatch_cpu pre -N 2 --ntasks=2 -- $A) || fail sbatch
wait_holds 1 || { show "$T/pre.out"; fail "job $id not held at step $S1"; }
scancel --signal=USR1 "$id"
wait_holds 2 || { show "$T/pre.out"; fail "job $id not requeued, resumed and held at step $S2"; }
[ "$(job_field "$id" JobState)" = RUNNING ] && [ "$(job_field "$id" Restarts)" = 1 ] || { show "$T/pre.out"; fail "job $id not running again after a requeue"; }
scancel --signal=USR1 "$id"
for _ in $(seq 1 600); do [ "$(job_field "$id" Restarts)" = 2 ] && [ "$(job_field "$id" JobState)" = PENDING ] && break; sleep 0.1; done
[ "$(job_field "$id" JobState)" = PENDING ] || { show "$T/pre.out"; fail "job $id not pending after the second stop"; }
for want in "checkpointing at step $S1 " "checkpointing at step $S2 "; do
  grep -q "stop signal received.*$want" "$T/pre.out" || { show "$T/pre.out"; fail "no stop at ${want% }"; }
done
scancel "$id"
# the same run directory (job name), one node
id2=$(sbatch_cpu pre -N 1 --ntasks=1 -- $A) || fail sbatch
wait_job "$id2" 300 || { show "$T/pre.out"; fail "job $id2 did not end"; }
expect_job "$id2" COMPLETED 0:0
for want in "run: job $id restart 0, .* 2 node(s) h\[1-2\], 2 task(s)" "run: job $id restart 1, .* 2 node(s) h\[1-2\], 2 task(s)" \
            "resumed from .*step_$(printf %08d "$S1") at step $S1 .* on 2 rank(s)" "run: job $id2 restart 0, .* 1 node(s) h[12], 1 task(s)" \
            "resumed from .*step_$(printf %08d "$S2") at step $S2 .* on 1 rank(s), zero stage 1 (saved by 2 rank(s)"; do
  grep -q -- "$want" "$T/pre.out" || { show "$T/pre.out" 40; fail "'$want' not in the output"; }
done
check_losses "$T/pre/train.jsonl" 1 "$S2" 1e-3 || { show "$T/pre.out"; fail "losses"; }
echo "3. 2 nodes: stopped at step $S1, requeued, resumed on 2 nodes; stopped at $S2, cancelled, resubmitted" \
     "with -N 1: resumed on 1 rank [$((SECONDS - t0)) s]"
echo "multinode ok in $((SECONDS - t0)) s"
