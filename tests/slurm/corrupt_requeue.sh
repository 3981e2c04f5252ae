#!/usr/bin/env bash
# A requeued job whose newest checkpoint is damaged, on a real Slurm (the private
# single-node cluster of tests/slurm/cluster.sh): a 2-task job of slurm/train_cpu.sbatch
# (--ckpt-every 10 --keep-last 3) gets `scancel --signal=USR1` mid-run: checkpoint at step S,
# exit 75, the template requeues it. While it waits for its restart (Slurm's requeue delay; the
# test starts it only after the damage, so there is no race), one byte of step S's master data
# is flipped. The restart (--resume auto) skips step S (one warning line, renamed
# step_S.bad-checksum), resumes the newest good checkpoint P < S, and the job COMPLETES after
# that one requeue (Restarts=1: no restart fails again on the same file): every
# step logged once, the rows P+1..S written again bitwise equal to the first run's, the
# JSONL's resume record names both, and --keep-last never pruned the .bad directory.
# Usage: tests/slurm/corrupt_requeue.sh BUILD/shardgpt [SOURCE_DIR]. Root only (exit 77
# otherwise). Every wait is bounded; a watchdog ends it after 10 minutes.
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: the Slurm tests start slurmctld, slurmd and munged: run as root"; exit 77; fi
source "$SRC/tests/slurm/cluster.sh"
slurm_install || { echo "FAIL: cannot install slurm-wlm"; exit 1; }
slurm_work_dir /tmp/shardgpt-slurm.XXXXXX || fail "mktemp"
slurm_test_scaffold "$T" "$C" 600
t0=$SECONDS
slurm_local_cluster_up "$C" || fail "private one-node cluster (the step above)"
echo "private cluster up in $((SECONDS - t0)) s"

for i in $(seq 1 300); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || fail prepare
# The first (fresh) run is held after step 25 until the signal has come
# (SHARDGPT_TEST_HOLD_AT_STEP; a resumed run is not held), so the signal lands mid-run however
# fast the machine is.
N=400
A="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 32 --n-head 2 --steps $N --lr 3e-3 --seed 5 --quiet --micro-batch 6 --zero-stage 1 --ckpt-every 10 --keep-last 3"
id=$(SHARDGPT_TEST_HOLD_AT_STEP=25 sbatch_cpu cr -- $A) || fail "sbatch"
wait_rows "$T/cr/train.jsonl" 25 240 || { show "$T/cr.out"; fail "job $id made no progress"; }
scancel --signal=USR1 "$id" || fail "scancel --signal=USR1"
# the requeued job waits (PENDING, BeginTime); nothing starts it early here
for _ in $(seq 1 600); do
  [ "$(job_field "$id" JobState)" = PENDING ] && [ "$(job_field "$id" Restarts)" = 1 ] && break
  sleep 0.2
done
[ "$(job_field "$id" JobState)" = PENDING ] || { show "$T/cr.out"; fail "job $id not pending for its restart"; }
S=$(stop_step "$T/cr.out")
[ -n "$S" ] && [ "$S" -ge 25 ] && [ "$S" -lt $N ] || { show "$T/cr.out"; fail "no stop mid-run"; }
P=$(((S - 1) / 10 * 10))
CK=$T/cr/ckpt
SD=$CK/step_$(printf %08d "$S")
PD=$CK/step_$(printf %08d "$P")
[ -f "$SD/index.h5" ] && [ -f "$PD/index.h5" ] || fail "expected checkpoints $S and $P: $(ls "$CK")"
cp "$T/cr/train.jsonl" "$T/first.jsonl"
# one byte in the first chunk of rank 1's master data, at the offset the index records
/usr/bin/python3 - "$SD" <<'PY' || fail "damaging step $S"
import json, sys
d = sys.argv[1]
raw = open(d + "/index.h5", "rb").read()
n = int([l for l in raw[:128].decode("ascii", "replace").split("\n") if l.startswith("json ")][0].split()[1])
fi = json.loads(raw[128:128 + n])["plan"]["files"][1]
p, off = d + "/" + fi["name"], fi["chunks"][0][0] + 40
b = bytearray(open(p, "rb").read()); b[off] ^= 4; open(p, "wb").write(b)
PY
wait_job "$id" 300 || { show "$T/cr.out"; fail "job $id did not end"; }
expect_job "$id" COMPLETED 0:0
[ "$(job_field "$id" Restarts)" = 1 ] || fail "job $id: Restarts=$(job_field "$id" Restarts), expected 1"
for want in "requeueing job $id" "run: job $id restart 1" \
            "shardgpt: warning: --resume auto: skipped $SD (checksum): $SD/rank_00001.h5: .*; renamed to $SD.bad-checksum" \
            "resumed from $PD at step $P .*; skipped damaged: $SD (checksum, now $SD.bad-checksum)" "final train loss"; do
  grep -q -- "$want" "$T/cr.out" || { show "$T/cr.out"; fail "'$want' not in the job's output"; }
done
[ -d "$SD.bad-checksum" ] || fail "step $S not kept as $SD.bad-checksum after the run (--keep-last 3): $(ls "$CK")"
/usr/bin/python3 - "$T/first.jsonl" "$T/cr/train.jsonl" "$N" "$P" "$S" "$PD" "$SD" <<'PY' || exit 1
import json, sys
first = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
rows = [json.loads(l) for l in open(sys.argv[2])]
n, p, s, pd, sd = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
assert [r["step"] for r in rows] == list(range(1, n + 1)), "every step logged once"
assert all(r["loss"] == first[r["step"]]["loss"] for r in rows if r["step"] <= s), "rows up to the stop differ"
res = rows[p]["resume"]  # the row of step p + 1
assert res["from"] == pd and [(x["dir"], x["reason"]) for x in res["skipped"]] == [(sd, "checksum")], res
print(f"  steps 1..{n} once each; steps {p + 1}..{s} rewritten after the fallback bitwise equal to the first run's")
PY
echo "corrupt newest checkpoint: stopped at $S, step $S damaged while pending, the restart skipped it (renamed" \
     ".bad-checksum) and resumed $P; COMPLETED 0:0 after one requeue [$((SECONDS - t0)) s]"
