#!/usr/bin/env bash
# slurm/train_gpu.sbatch, unmodified, on a real Slurm: a private single-node cluster
# (tests/slurm/cluster.sh) whose node has $GPUS GPUs as Slurm sees them (Gres=gpu:$GPUS over
# placeholder character devices, slurm_add_gpus), so that Slurm itself sets each task's
# CUDA_VISIBLE_DEVICES from the template's `srun --gpu-bind=$SHARDGPT_GPU_BIND` (default none:
# every task sees all the node's GPUs; per_task:1: each task sees its own).
# The trainer is a shardgpt built with the CUDA emulation (emu/cuda/: --device cuda and
# --comm nccl on the CPU; $SHARDGPT_CUDA_EMU_DEVICES emulated GPUs, each with its own PCI bus
# id, chosen by CUDA_VISIBLE_DEVICES). What this machine cannot give is overridden on the
# sbatch command line (sbatch_gpu: --nodes=1 --ntasks-per-node=2 --cpus-per-task=1).
#   0. the template with a stand-in for shardgpt (a script printing what Slurm gave its task):
#      by default every task sees both GPUs (Slurm 22.05 leaves CUDA_VISIBLE_DEVICES unset;
#      "0,1" passes too) and has its own SLURM_LOCALID; with SHARDGPT_GPU_BIND=per_task:1 each task gets one GPU, a different one:
#      CUDA_VISIBLE_DEVICES 0 and 1;
#   1. a 2-task job trains (--comm nccl) to COMPLETED 0:0: rank r's topology line names device
#      cuda:r (GPU = node-local rank of the 2 it sees), set before MPI_Init from SLURM_LOCALID,
#      with the bus id of the GPU `mpirun -np 2` outside Slurm gives local rank r; losses within
#      1e-4 of that mpirun run;
#   1p. SHARDGPT_GPU_BIND=per_task:1: each rank on cuda:0 (the one GPU it sees), the two bus
#      ids those of the reference's GPUs; losses within 1e-4 of the reference;
#   2. a 2-task job gets `scancel --signal=USR1` mid-run: checkpoint, exit 75, the template
#      requeues it, it resumes on 2 ranks and finishes: every step logged once, losses within
#      1e-4 of the mpirun run.
# Usage: tests/slurm/gpu.sh BUILD-EMU/shardgpt [SOURCE_DIR]: all of the above. Exits 77
# (skipped) when not root, or when the binary is not the CUDA emulation: a 6-step probe
# `shardgpt train --device cuda --comm nccl` (CUDA_VISIBLE_DEVICES=1 of 2 emulated GPUs) must
# name an emulated device ("emulat" in its topology line, or the string "shardgpt CUDA
# emulation" in the binary or a library of the build it links); "no usable GPU" (a real CUDA
# build without a GPU), "built without the CUDA backend" and a real GPU are skips. An emulation
# build whose probe fails is a failure. Also 77 where mknod is not permitted (a container).
#        tests/slurm/gpu.sh --cluster-only [SOURCE_DIR]: no shardgpt at all: 0, then
#   0r. the stand-in waits for SIGUSR1 (scancel --signal=USR1), exits 75, the template
#      requeues the job, the rerun (restart 1) again sees all GPUs in every task, COMPLETED 0:0.
# Every wait is bounded; a watchdog ends the script (and the cluster) after 14 minutes.
set -uo pipefail
CLUSTER_ONLY=0
if [ "${1:-}" = --cluster-only ]; then CLUSTER_ONLY=1; BIN=; else BIN=$(realpath "${1:?usage: gpu.sh BIN|--cluster-only [SRC]}"); fi
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: the Slurm tests start slurmctld, slurmd and munged: run as root"; exit 77; fi
source "$SRC/tests/slurm/cluster.sh"

unset CUDA_VISIBLE_DEVICES  # the reference below picks its GPUs itself; Slurm sets it for its tasks
GPUS=2          # GPUs of the node (Gres=gpu:2), tasks per job (one per GPU), emulated GPUs
export SHARDGPT_CUDA_EMU_DEVICES=$GPUS GPU_TASKS=$GPUS
# Two ranks on two cores shared with other work, and the emulated NCCL blocks in MPI: Open MPI
# started by srun busy-polls unless told to yield (see train_cpu.sbatch). Numerics unchanged;
# every job and the mpirun reference get it (sbatch exports the environment to the tasks).
export OMPI_MCA_mpi_yield_when_idle=1
slurm_work_dir /tmp/shardgpt-slurm-gpu.XXXXXX || fail "mktemp"

# ---- is BIN the CUDA emulation? (before any daemon starts) ----
# 1 rank, 6 steps, the second of two emulated GPUs: a few seconds; it names the device and times a step.
TINY="--seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --micro-batch 2"
if [ $CLUSTER_ONLY = 0 ]; then
  for i in $(seq 1 300); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
  "$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { rm -rf "$T"; echo "FAIL: shardgpt prepare"; exit 1; }
  probe=$(CUDA_VISIBLE_DEVICES=1 timeout 120 "$BIN" train --device cuda --comm nccl --data "$T/data/train.bin" $TINY \
            --steps 6 --threads 1 2>&1); prc=$?
  emu=0
  grep -i "^rank 0: .*emulat" <<<"$probe" >/dev/null && emu=1
  for f in "$BIN" $(ldd "$BIN" 2>/dev/null | awk '$3 ~ /^\// {print $3}' | grep -v '^/lib\|^/usr/lib'); do
    [ $emu = 1 ] && break
    grep -aq "shardgpt CUDA emulation" "$f" && emu=1
  done
  if [ $emu = 0 ]; then
    rm -rf "$T"
    why=$(grep "^shardgpt: error:" <<<"$probe" | head -1); [ -n "$why" ] || why=$(grep "^rank 0:" <<<"$probe" | head -1)
    echo "SKIP: $BIN is not built with the CUDA emulation (probe, rc $prc: ${why:-no device named})"; exit 77
  fi
  [ $prc = 0 ] || { rm -rf "$T"; echo "$probe" | tail -20; echo "FAIL: the emulation build's 1-rank probe (--device cuda --comm nccl) failed, rc $prc"; exit 1; }
  # calibrate the run length: about 10 s of single-rank steps (2 ranks take longer), 30..6000 steps
  ms=$(sed -n 's/^step .*| *\([0-9.]*\) ms |.*/\1/p' <<<"$probe" | tail -3 | sort -n | tail -1)
  N=${GPU_SLURM_STEPS:-$(/usr/bin/python3 -c 'import sys; ms = float(sys.argv[1] or 0); print(max(30, min(6000, int(10000 / ms))) if ms > 0 else 60)' "$ms")}
  echo "probe: $(grep '^rank 0:' <<<"$probe") ($ms ms/step): $N steps per run"
fi

slurm_install || { rm -rf "$T"; echo "FAIL: cannot install slurm-wlm"; exit 1; }
# the placeholder GPUs are character devices (slurm_add_gpus): a container may forbid mknod
mknod "$T/mknod-probe" c 195 0 2>/dev/null || { rm -rf "$T"; echo "SKIP: mknod (a character device) not permitted here"; exit 77; }
rm -f "$T/mknod-probe"
slurm_test_scaffold "$T" "$C" 840

t0=$SECONDS
slurm_local_cluster_up "$C" 'slurm_add_gpus "$C" $GPUS' || fail "private one-node cluster with placeholder GPUs (the step above)"
gres=$(scontrol show node localhost | sed -n 's/^ *Gres=\([^ ]*\).*/\1/p')
[ "$gres" = "gpu:$GPUS" ] || { tail -5 "$C/log/slurmd-localhost.log"; fail "node has Gres=$gres, expected gpu:$GPUS"; }
grep -q "not a valid character or block device" "$C/log/slurmd-localhost.log" && { show "$C/log/slurmd-localhost.log" 10; fail "slurmd refused the gres devices"; }
echo "private cluster up in $((SECONDS - t0)) s: $(sinfo -h -o '%P %D %t %N %G')"

# ---- the stand-in for shardgpt: what Slurm gave its task ----
# FAKE_STOP=1: the first run (restart 0) waits for SIGUSR1 (at most 120 s) and exits 75, as a
# checkpointed stop; reruns exit 0. $RUN_DIR/ready.<task> tells the test its trap is set.
cat > "$T/fake-shardgpt" <<'EOF'
#!/bin/bash
echo "fake: task $SLURM_PROCID/$SLURM_NTASKS restart ${SLURM_RESTART_COUNT:-0} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} SLURM_LOCALID=${SLURM_LOCALID-unset} SLURM_STEP_GPUS=${SLURM_STEP_GPUS-unset} args: $*"
if [ "${FAKE_STOP:-0}" = 1 ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  trap 'kill $s 2>/dev/null; echo "fake: task $SLURM_PROCID: SIGUSR1, exit 75"; exit 75' USR1
  sleep 120 & s=$!
  touch "$RUN_DIR/ready.$SLURM_PROCID"
  wait $s
  exit 1
fi
exit 0
EOF
chmod 755 "$T/fake-shardgpt"
# fake_gpus OUTPUT RESTART [all]: the tasks' CUDA_VISIBLE_DEVICES in that run, by task ("0 1",
# or with `all` "unset unset"); fails unless there is one line per task, task r with
# SLURM_LOCALID r (one node), and each task with one GPU, all different (all: every task sees
# all the node's GPUs: CUDA_VISIBLE_DEVICES unset, as Slurm 22.05 leaves it under
# --gpu-bind=none, or listing all $GPUS).
fake_gpus() {
  local got all
  all=$(seq -s, 0 $((GPUS - 1)))
  got=$(sed -n "s/^fake: task \([0-9]*\)\/[0-9]* restart $2 CUDA_VISIBLE_DEVICES=\([^ ]*\) SLURM_LOCALID=\1 .*/\1 \2/p" "$1" | sort -n)
  [ "$(wc -l <<<"$got")" = "$GPUS" ] || { echo "  expected $GPUS task lines of restart $2 (SLURM_LOCALID = task), got: $got"; return 1; }
  [ "$(cut -d' ' -f1 <<<"$got" | tr '\n' ' ')" = "$(seq -s ' ' 0 $((GPUS - 1))) " ] || { echo "  tasks: $got"; return 1; }
  if [ "${3:-}" = all ]; then
    cut -d' ' -f2 <<<"$got" | grep -qvx "$all\|unset" && { echo "  not all $GPUS GPUs ($all or unset) in every task: $got"; return 1; }
    cut -d' ' -f2 <<<"$got" | paste -sd' '
    return 0
  fi
  cut -d' ' -f2 <<<"$got" | grep -qvx '[0-9]*' && { echo "  not one GPU each: $got"; return 1; }
  [ "$(cut -d' ' -f2 <<<"$got" | sort -u | wc -l)" = "$GPUS" ] || { echo "  GPUs shared: $got"; return 1; }
  [ "$(cut -d' ' -f2 <<<"$got" | sort -n | tr '\n' ' ')" = "$(seq -s ' ' 0 $((GPUS - 1))) " ] || { echo "  GPUs outside 0..$((GPUS - 1)): $got"; return 1; }
  cut -d' ' -f2 <<<"$got" | paste -sd' '
}

# ---- 0. by default every task sees all the node's GPUs; per_task:1 on request ----
# (with --gpu-bind=none Slurm 22.05 sets no CUDA_VISIBLE_DEVICES: a task sees every GPU its
# node's device cgroup, if any, lets through, and an emulated rank all $GPUS)
unset SHARDGPT_GPU_BIND  # the template's default
id=$(BIN=$T/fake-shardgpt sbatch_gpu bind -- --fake-flag) || fail "sbatch"
wait_job "$id" 60 || { show "$T/bind.out"; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
g=$(fake_gpus "$T/bind.out" 0 all) || { show "$T/bind.out"; fail "default GPU binding (none): $g"; }
grep -q "^fake: task 0/$GPUS .* args: train --device cuda --threads 1 --ckpt-dir $T/bind/ckpt --resume auto --log $T/bind/train.jsonl --fake-flag$" "$T/bind.out" \
  || { show "$T/bind.out"; fail "the stand-in did not get the template's arguments"; }
grep -q "^run: job $id restart 0, .*, --gpu-bind=none$" "$T/bind.out" || { show "$T/bind.out"; fail "no '--gpu-bind=none' in the run line"; }
echo "0. train_gpu.sbatch, $GPUS tasks: CUDA_VISIBLE_DEVICES by task: $g (srun --gpu-bind=none), COMPLETED 0:0 [$((SECONDS - t0)) s]"
id=$(BIN=$T/fake-shardgpt SHARDGPT_GPU_BIND=per_task:1 sbatch_gpu bindpt -- --fake-flag) || fail "sbatch"
wait_job "$id" 60 || { show "$T/bindpt.out"; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
g=$(fake_gpus "$T/bindpt.out" 0) || { show "$T/bindpt.out"; fail "per-task GPU binding: $g"; }
grep -q "^run: job $id restart 0, .*, --gpu-bind=per_task:1$" "$T/bindpt.out" || { show "$T/bindpt.out"; fail "no '--gpu-bind=per_task:1' in the run line"; }
echo "0. SHARDGPT_GPU_BIND=per_task:1: CUDA_VISIBLE_DEVICES by task: $g (srun --gpu-bind=per_task:1), COMPLETED 0:0 [$((SECONDS - t0)) s]"

if [ $CLUSTER_ONLY = 1 ]; then
  # ---- 0r. stop signal -> exit 75 -> requeue -> rerun, again one GPU per task ----
  id=$(BIN=$T/fake-shardgpt FAKE_STOP=1 sbatch_gpu stop --) || fail "sbatch"
  for _ in $(seq 1 600); do [ "$(ls "$T/stop"/ready.* 2>/dev/null | wc -l)" -ge $GPUS ] && break; sleep 0.1; done
  [ "$(ls "$T/stop"/ready.* 2>/dev/null | wc -l)" -ge $GPUS ] || { show "$T/stop.out"; fail "the stand-in's tasks not waiting after 60 s"; }
  scancel --signal=USR1 "$id" || fail "scancel --signal=USR1"
  wait_job "$id" 120 || { show "$T/stop.out"; fail "job $id did not end"; }
  expect_job "$id" COMPLETED 0:0
  for want in "run: job $id restart 0" "SIGUSR1, exit 75" "Exited with exit code 75" "requeueing job $id" "run: job $id restart 1"; do
    grep -q -- "$want" "$T/stop.out" || { show "$T/stop.out"; fail "'$want' not in the job's output"; }
  done
  [ "$(job_field "$id" Restarts)" = 1 ] || fail "job $id: Restarts=$(job_field "$id" Restarts), expected 1"
  g0=$(fake_gpus "$T/stop.out" 0 all) || { show "$T/stop.out"; fail "restart 0: $g0"; }
  g1=$(fake_gpus "$T/stop.out" 1 all) || { show "$T/stop.out"; fail "restart 1: $g1"; }
  echo "0r. scancel --signal=USR1: exit 75, requeued, rerun COMPLETED 0:0 (Restarts=1); CUDA_VISIBLE_DEVICES by task:" \
       "run 1: $g0, run 2: $g1 [$((SECONDS - t0)) s]"
  echo "slurm gpu (cluster only) ok in $((SECONDS - t0)) s"
  exit 0
fi

# ---- the reference: mpirun -np 2 outside Slurm, each rank on GPU <local rank> of 2 ----
FLAGS="--data $T/data/train.bin $TINY --steps $N --lr 3e-3 --seed 5 --zero-stage 1 --comm nccl"
t_ref=$SECONDS
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
  mpirun -np 2 --oversubscribe "$BIN" train --device cuda $FLAGS --threads 1 --log "$T/ref.jsonl" > "$T/ref.out" 2>&1 \
  || { show "$T/ref.out"; fail "mpirun reference run"; }
t_ref=$((SECONDS - t_ref))
# topology OUTPUT: "rank local_rank/local_size device bus comm" per line of shardgpt's topology
topology() {
  sed -n 's/^rank \([0-9]*\): host [^,]*, local rank \([0-9]*\/[0-9]*\), \(cuda:[0-9]*\) (.*, bus \([^)]*\)), comm \([a-z]*\).*/\1 \2 \3 \4 \5/p' "$1" | sort -n
}
ref_topo=$(topology "$T/ref.out")
ref_bus=$(awk '{print $4}' <<<"$ref_topo" | sort)
[ "$(wc -l <<<"$ref_topo")" = 2 ] && [ "$(sort -u <<<"$ref_bus" | wc -l)" = 2 ] && [ "$(awk '{print $5}' <<<"$ref_topo" | sort -u)" = nccl ] \
  || { show "$T/ref.out"; fail "reference: expected 2 topology lines, two bus ids, comm nccl"; }
echo "reference: mpirun -np 2, $N steps in $t_ref s; $(tr '\n' ';' <<<"$ref_topo")"

# ---- 1. trains to the end, every task seeing both GPUs and taking its local rank's ----
id=$(sbatch_gpu full -- $FLAGS) || fail "sbatch"
wait_job "$id" 300 || { show "$T/full.out"; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
[ "$(job_field "$id" Restarts)" = 0 ] || fail "job $id was requeued"
topo=$(topology "$T/full.out")
# rank r on local rank r/2 takes cuda:r (GPU = local rank of the 2 it sees), comm nccl, on the
# bus id the reference's rank r has
awk '{print $1, $2, $3, $5}' <<<"$topo" | diff - <(printf '0 0/2 cuda:0 nccl\n1 1/2 cuda:1 nccl\n') >/dev/null \
  || { show "$T/full.out"; fail "topology: expected ranks 0 and 1 on local ranks 0/2, 1/2, on cuda:0 and cuda:1 (both GPUs visible), comm nccl"; }
[ "$(awk '{print $1, $4}' <<<"$topo")" = "$(awk '{print $1, $4}' <<<"$ref_topo")" ] \
  || { show "$T/full.out"; fail "bus ids by rank $(awk '{print $4}' <<<"$topo" | tr '\n' ' ')differ from the reference's ($(awk '{print $4}' <<<"$ref_topo" | tr '\n' ' '))"; }
# the GPU was set before MPI_Init, from srun's SLURM_LOCALID
for r in 0 1; do
  grep -q "^rank $r: .*, set before MPI_Init from SLURM_LOCALID=$r\b" "$T/full.out" \
    || { show "$T/full.out"; fail "rank $r: no 'set before MPI_Init from SLURM_LOCALID=$r' in its topology line"; }
done
check_losses "$T/full/train.jsonl" 1 0 1e-4 || { show "$T/full.out"; fail "srun job vs mpirun"; }
echo "1. 2-task job, --gpu-bind=none, --comm nccl, COMPLETED 0:0; rank 0 on cuda:0 bus $(awk '$1 == 0 {print $4}' <<<"$topo"), rank 1 on" \
     "cuda:1 bus $(awk '$1 == 1 {print $4}' <<<"$topo") (set before MPI_Init from SLURM_LOCALID); losses within 1e-4 of mpirun -np 2 [$((SECONDS - t0)) s]"

# ---- 1p. SHARDGPT_GPU_BIND=per_task:1: each task sees one GPU ----
id=$(SHARDGPT_GPU_BIND=per_task:1 sbatch_gpu pertask -- $FLAGS) || fail "sbatch"
wait_job "$id" 300 || { show "$T/pertask.out"; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
topo=$(topology "$T/pertask.out")
awk '{print $1, $2, $3, $5}' <<<"$topo" | diff - <(printf '0 0/2 cuda:0 nccl\n1 1/2 cuda:0 nccl\n') >/dev/null \
  || { show "$T/pertask.out"; fail "per_task:1 topology: expected ranks 0 and 1 on local ranks 0/2, 1/2, each on cuda:0 (one visible GPU), comm nccl"; }
[ "$(awk '{print $4}' <<<"$topo" | sort)" = "$ref_bus" ] \
  || { show "$T/pertask.out"; fail "per_task:1 bus ids $(awk '{print $4}' <<<"$topo" | tr '\n' ' ')are not two different GPUs of the reference's ($(tr '\n' ' ' <<<"$ref_bus"))"; }
check_losses "$T/pertask/train.jsonl" 1 0 1e-4 || { show "$T/pertask.out"; fail "per_task:1 job vs mpirun"; }
echo "1p. SHARDGPT_GPU_BIND=per_task:1: each rank on cuda:0 (one visible GPU), buses" \
     "$(awk '{print $4}' <<<"$topo" | paste -sd' '); losses within 1e-4 of mpirun -np 2 [$((SECONDS - t0)) s]"

# ---- 2. scancel --signal=USR1 mid-run -> checkpoint, exit 75, requeue, resume, finish ----
# Held at step N/10 until the signal has come (SHARDGPT_TEST_HOLD_AT_STEP; a resumed run is not
# held): the run cannot end before scancel's signal however fast or starved this machine is.
pre=pre
id=$(SHARDGPT_TEST_HOLD_AT_STEP=$((N / 10 + 1)) sbatch_gpu $pre -- $FLAGS --quiet) || fail "sbatch"
wait_rows "$T/$pre/train.jsonl" $((N / 10 + 1)) 240 || { show "$T/$pre.out"; fail "job $id made no progress"; }
scancel --signal=USR1 "$id" || fail "scancel --signal=USR1"
wait_job "$id" 300 || { show "$T/$pre.out"; fail "job $id did not end"; }
S=$(stop_step "$T/$pre.out")
expect_job "$id" COMPLETED 0:0
[ "$S" = $((N / 10 + 1)) ] || { show "$T/$pre.out"; fail "no stop at the held step $((N / 10 + 1))"; }
for want in "run: job $id restart 0" "Exited with exit code 75" "requeueing job $id" "run: job $id restart 1" \
            "resumed from $T/$pre/ckpt/step_$(printf %08d "$S") at step $S .* on 2 rank(s)" "final train loss"; do
  grep -q -- "$want" "$T/$pre.out" || { show "$T/$pre.out"; fail "'$want' not in the job's output"; }
done
[ "$(job_field "$id" Restarts)" = 1 ] || fail "job $id: Restarts=$(job_field "$id" Restarts), expected 1"
check_losses "$T/$pre/train.jsonl" 1 0 1e-4 || { show "$T/$pre.out"; fail "preempted job vs uninterrupted"; }
same=$(/usr/bin/python3 -c 'import json, sys; l = lambda f: [json.loads(r)["loss"] for r in open(f)]; print("bitwise equal to" if l(sys.argv[1]) == l(sys.argv[2]) else "not bitwise equal to")' \
  "$T/$pre/train.jsonl" "$T/full/train.jsonl")
echo "2. scancel --signal=USR1: stopped at step $S, exit 75, requeued, resumed on 2 ranks, COMPLETED (Restarts=1);" \
     "within 1e-4 of mpirun, $same job 1 [$((SECONDS - t0)) s]"
echo "slurm gpu ok in $((SECONDS - t0)) s"
