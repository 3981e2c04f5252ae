#!/usr/bin/env bash
# The flight recorder and `shardgpt diagnose` on real runs, through the test fault hooks
# (SHARDGPT_TEST_FAULT, parallel/flight_recorder.h): for each fault, every rank's dump and the
# verdict naming the right rank, class and phase.
#   stop-forward  3 ranks, rank 1 hangs when its forward of unit 2 at step 3 begins: not-arrived,
#                 rank 1, phase forward unit 2 (its dump written at the watchdog's request); the
#                 job's own output has one verdict line, the same, and no line accuses rank 0 or 2
#   hsdp          the same at 4 ranks in HSDP groups of 2: rank 3 named on its shard and replica
#                 communicators
#   size          3 ranks, rank 2 broadcasts 65 floats where the others broadcast 64: mismatch,
#                 rank 2 the culprit
#   skip          2 ranks, rank 1 skips a step boundary's agreement: not-arrived, rank 1
#   stop-data     3 ranks, rank 2 hangs when its data phase of step 3 begins (a stuck data
#                 loader): not-arrived, rank 2, phase data
#   killed        the stop-forward dumps without rank 1's: no-dump names rank 1
#   kill          rank 1 dies by SIGKILL when its data phase of step 3 begins (no handler, no
#                 dump). 2 ranks under mpirun's defaults: mpirun ends every rank at once (no
#                 survivor lives to dump) and names rank 1 killed by signal 9; the job ends
#                 non-zero, no rank left running. 3 ranks with a launcher that lets the
#                 survivors run (orte_abort_on_non_zero_status 0, as srun without
#                 --kill-on-bad-exit): their watchdog names rank 1, they dump, and diagnose
#                 says no-dump, rank 1
#   segv          1 rank raises SIGSEGV: it dies by it and leaves a dump that diagnose reads
#   sigusr2       a dump on SIGUSR2 while the run goes on (it then stops on SIGTERM as usual)
# and diagnose's refusals: a folder without dumps, a truncated dump, dumps of two runs.
# Every wait is for an event (a file, a log line, the job's end); the watchdog's 10 s timeout
# only starts once the fault fired, and the waits are bounded far above it.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_prepare 400 "In the beginning God created the heaven and the earth."
ARGS="--data $T/data/train.bin --n-layer 2 --n-embd 32 --n-head 2 --seq-len 16 --micro-batch 2 --steps 100000 --quiet --threads 1"

# run_fault NAME RANKS FAULT EXTRA...: the job ends (non-zero) by the watchdog; dumps in $T/NAME
run_fault() {
  local name=$1 np=$2 fault=$3
  shift 3
  SHARDGPT_TEST_FAULT=$fault timeout 300 mpirun -np "$np" --oversubscribe "$BIN" train $ARGS --comm-timeout 10 \
    --flight-dir "$T/$name" "$@" > "$T/$name.out" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/$name.out"; fail "$name: exit status $rc"; }
}
# expect NAME RC PATTERN...: diagnose's output on $T/NAME has exit status RC and every pattern
expect() {
  local name=$1 want_rc=$2
  shift 2
  "$BIN" diagnose "$T/$name" > "$T/$name.diag" 2>&1
  local rc=$?
  [ $rc -eq "$want_rc" ] || { cat "$T/$name.diag"; fail "$name: diagnose exit status $rc, expected $want_rc"; }
  for want in "$@"; do
    grep -qE -- "$want" "$T/$name.diag" || { cat "$T/$name.out" "$T/$name.diag"; fail "$name: diagnose lacks /$want/"; }
  done
  echo "ok   $name: $(head -2 "$T/$name.diag" | tr '\n' ' ')"
}

run_fault stop 3 stop-forward:1:3:2 --zero-stage 3
ls "$T/stop"/rank_0000{0,1,2}.json >/dev/null || fail "stop: not every rank wrote a dump"
expect stop 3 '^not-arrived$' 'rank 1 never reached it' 'phase forward unit 2' 'rank\(s\) 0, 2 arrived'
# one verdict for the job: the rank that claimed it prints the dumps' analysis in exactly one
# line naming rank 1; the other expired rank points to it; no line accuses rank 0 or 2
job_verdict_ok() {  # NAME CULPRIT HEALTHY: the checks on $T/NAME.out; HEALTHY: a regex class
  local name=$1 culprit=$2 healthy=$3 n
  n=$(grep -c "the job's verdict from the flight dumps" "$T/$name.out")
  [ "$n" -eq 1 ] || { cat "$T/$name.out"; fail "$name: $n job verdict lines, expected 1"; }
  grep "the job's verdict from the flight dumps" "$T/$name.out" | grep -qE "$culprit" ||
    { cat "$T/$name.out"; fail "$name: the job's verdict lacks /$culprit/"; }
  if grep -E "this rank's view|culprit rank\(s\) [^:]*\b$healthy\b" "$T/$name.out"; then
    cat "$T/$name.out"; fail "$name: a line names a healthy rank, or a rank states its own view"
  fi
}
job_verdict_ok stop 'not-arrived: culprit rank\(s\) 1: never reached seq [0-9]+ on world .*phase forward unit 2' '[02]'
"$BIN" diagnose --json "$T/stop" > "$T/stop.json"  # status 3: a verdict
python3 - "$T/stop.json" <<'PY' || fail "stop: --json does not name rank 1 in forward unit 2"

import json, sys
j = json.load(open(sys.argv[1]))
c = j["communicators"][0]
assert j["verdict"] == "not-arrived" and c["culprits"][0]["rank"] == 1 and c["culprits"][0]["phase"] == "forward unit 2", j
PY

# HSDP (2 groups of 2): the shard and replica communicators are recorded and named
run_fault hsdp 4 stop-forward:3:3:1 --zero-stage 3 --shard-group-size 2
expect hsdp 3 '^not-arrived$' '^shard \(ranks 2, 3\): .*rank 3 never reached it.*phase forward unit 1' \
  '^replica \(ranks 1, 3\): .*rank 3 never reached it'

run_fault size 3 size:2:3
expect size 3 '^mismatch$' 'rank 2 issued broadcast f32 x 65.*\(the culprit\)' 'rank\(s\) 0, 1 issued broadcast f32 x 64'

run_fault skip 2 skip:1:3
expect skip 3 '^not-arrived$' 'rank 1 never reached it'

mkdir "$T/killed" && cp "$T/stop/rank_00000.json" "$T/stop/rank_00002.json" "$T/killed/"
expect killed 3 'no dump from rank\(s\) 1'

run_fault loader 3 stop-data:2:3
ls "$T/loader"/rank_0000{0,1,2}.json >/dev/null || fail "stop-data: not every rank wrote a dump"
expect loader 3 '^not-arrived$' 'rank 2 never reached it.*phase data for' 'rank\(s\) 0, 1 arrived' 'rank 2: peer_request'

# kill under mpirun's defaults: the job ends at once, mpirun's own line names the killed rank
SHARDGPT_TEST_FAULT=kill:1:3 timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --comm-timeout 10 \
  --flight-dir "$T/kill" > "$T/kill.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/kill.out"; fail "kill: exit status $rc"; }
grep -qE "process rank 1 with PID [0-9]+ on node .* exited on signal 9" "$T/kill.out" ||
  { cat "$T/kill.out"; fail "kill: the job's output does not name rank 1 killed by signal 9"; }
pgrep -f "$T/data/train.bin" >/dev/null && fail "kill: a rank is still running"
[ ! -e "$T/kill/rank_00001.json" ] || fail "kill: the killed rank left a dump"
echo "ok   kill (mpirun's defaults): exit $rc; $(grep -m1 'exited on signal 9' "$T/kill.out")"

# kill with the survivors left running: their watchdog ends the job, diagnose names rank 1
SHARDGPT_TEST_FAULT=kill:1:3 timeout 300 mpirun --mca orte_abort_on_non_zero_status 0 -np 3 --oversubscribe \
  "$BIN" train $ARGS --comm-timeout 10 --flight-dir "$T/kill3" > "$T/kill3.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/kill3.out"; fail "kill3: exit status $rc"; }
# the job's verdict line (from the survivors' dumps), or a survivor's own view if none was printed
grep -qE "verdict from the flight dumps .*: no-dump: culprit rank\(s\) 1:|this rank's view: .*rank\(s\) 1 did not arrive" \
  "$T/kill3.out" || { cat "$T/kill3.out"; fail "kill3: no watchdog line naming rank 1"; }
pgrep -f "$T/data/train.bin" >/dev/null && fail "kill3: a rank is still running"
ls "$T/kill3"/rank_0000{0,2}.json >/dev/null || { cat "$T/kill3.out"; fail "kill3: a survivor wrote no dump"; }
[ ! -e "$T/kill3/rank_00001.json" ] || fail "kill3: the killed rank left a dump"
expect kill3 3 '^no-dump$' 'rank\(s\) 0, 2 arrived and none completed' 'no dump from rank\(s\) 1 '

# SIGSEGV in the only rank: the dump is written before the process dies by the signal
SHARDGPT_TEST_FAULT=segv:0:2 timeout 300 "$BIN" train $ARGS --flight-dir "$T/segv" > "$T/segv.out" 2>&1
rc=$?
[ $rc -eq 139 ] || { cat "$T/segv.out"; fail "segv: exit status $rc, expected 139 (SIGSEGV)"; }
grep -q '"reason":"sigsegv"' "$T/segv/rank_00000.json" || fail "segv: no dump with reason sigsegv"
expect segv 0 '^all-idle$' 'rank 0: sigsegv'

# SIGUSR2: a dump, the run goes on; then the usual stop. The hold keeps the run at a known step
# until the stop signal, so the test waits for events only.
SHARDGPT_TEST_HOLD_AT_STEP=2 "$BIN" train $ARGS --ckpt-dir "$T/ck" > "$T/usr2.out" 2>&1 &
pid=$!
for i in $(seq 1 600); do grep -q "test hook: holding" "$T/usr2.out" && break; sleep 0.1; done
grep -q "test hook: holding" "$T/usr2.out" || { kill -9 $pid; fail "sigusr2: the run never reached its hold"; }
kill -USR2 $pid
for i in $(seq 1 600); do [ -f "$T/ck/flight/rank_00000.json" ] && break; sleep 0.1; done
[ -f "$T/ck/flight/rank_00000.json" ] || { kill -9 $pid; fail "sigusr2: no dump under --ckpt-dir/flight"; }
kill -0 $pid 2>/dev/null || fail "sigusr2: the run ended on SIGUSR2"
kill -USR2 $pid  # a second dump never overwrites the first
for i in $(seq 1 600); do [ -f "$T/ck/flight/rank_00000.1.json" ] && break; sleep 0.1; done
[ -f "$T/ck/flight/rank_00000.1.json" ] || { kill -9 $pid; fail "sigusr2: the second dump is not rank_00000.1.json"; }
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 75 ] || { cat "$T/usr2.out"; fail "sigusr2: after SIGTERM exit status $rc, expected 75"; }
mv "$T/ck/flight" "$T/usr2"
expect usr2 0 '^all-idle$' 'rank 0: sigusr2'

# refusals: one line naming the folder or file, exit 1
mkdir "$T/empty"
"$BIN" diagnose "$T/empty" > "$T/e.out" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "no flight dumps here" "$T/e.out" || { cat "$T/e.out"; fail "empty folder: status $rc"; }
mkdir "$T/trunc" && head -c 500 "$T/stop/rank_00000.json" > "$T/trunc/rank_00000.json"
"$BIN" diagnose "$T/trunc" > "$T/e.out" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "rank_00000.json: not a complete flight dump" "$T/e.out" || { cat "$T/e.out"; fail "truncated: status $rc"; }
mkdir "$T/mixed" && cp "$T/stop/rank_00000.json" "$T/mixed/" && cp "$T/size/rank_00001.json" "$T/mixed/"
"$BIN" diagnose "$T/mixed" > "$T/e.out" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "flight dumps of different runs" "$T/e.out" || { cat "$T/e.out"; fail "mixed runs: status $rc"; }
[ "$(wc -l < "$T/e.out")" -eq 1 ] || fail "mixed runs: more than one line"
echo "flight_recorder ok"
