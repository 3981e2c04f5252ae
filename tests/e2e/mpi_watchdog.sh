#!/usr/bin/env bash
# A hung peer on the MPI path. Without flight dumps (each rank states its own view): one rank
# of a 2-rank run is SIGSTOPped after
# the log shows a step (a point the test waits for, not a time); with --comm-timeout 10 the
# other rank ends the job with one line naming the MPI call, the step and rank 1, and a
# non-zero exit, never a hang; rank 1 itself, resumed before its kill, names no peer.
#
# The stop lands where it lands: before rank 1 entered the collective ("did not arrive") or
# inside it, after its arrival note ("arrived but sent nothing": a rank waiting inside a call
# notes it again every heartbeat, a stopped one does not). Either verdict names rank 1; "every
# rank arrived (MPI itself is stuck)" fails the test (the stop lands inside a collective more
# often where a step spends more of its time in them, as in the sanitized pass). The
# verdict itself, case by case, is tests/unit/stall_verdict_test.cc. (Stopping rank 0 first so
# that rank 1 waits inside a collective does not force the second verdict: with messages this
# small rank 0 completes its side on resuming and rank 1 is then missing from the next call.)
set -uo pipefail
BIN=$1
T=$(mktemp -d)
stopped=""
cleanup() { [ -n "$stopped" ] && { kill -CONT $stopped 2>/dev/null; kill -9 $stopped 2>/dev/null; }; rm -rf "$T"; }
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 400) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || exit 1
ARGS="--data $T/data/train.bin --n-layer 1 --n-embd 32 --n-head 2 --seq-len 16 --micro-batch 2 --steps 100000 --quiet"

run_case() {
  local name=$1 log="$T/$1.jsonl" out="$T/$1.out"
  # --comm-timeout 10, not less: a peer legitimately descheduled or stalled in an fsync for a few
  # seconds (other tests beside this one on 2 cores) must not end the job before the stop.
  mpirun -np 2 --oversubscribe "$BIN" train $ARGS --comm-timeout 10 --log "$log" > "$out" 2>&1 &
  local mpid=$!
  for i in $(seq 1 600); do [ -s "$log" ] && break; sleep 0.1; done
  [ -s "$log" ] || { echo "FAIL ($name): no step logged"; kill -9 $mpid; exit 1; }
  # the rank that is not rank 0 (rank 0 writes the log): its pid
  local victim="" p r
  for p in $(pgrep -f "shardgpt train.*$log" | grep -v "^$mpid\$"); do
    r=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = 1 ] && victim=$p
  done
  [ -n "$victim" ] || { echo "FAIL ($name): rank 1 not found"; kill -9 $mpid; exit 1; }
  kill -STOP "$victim"; stopped=$victim
  # ended by the watchdog: bounded by far more than the 10 s timeout, so speed does not matter
  for i in $(seq 1 1200); do kill -0 $mpid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $mpid 2>/dev/null; then echo "FAIL ($name): the job still runs 120 s after rank 1 was stopped (no watchdog)"; kill -9 $mpid; exit 1; fi
  wait $mpid; local rc=$?
  kill -9 $victim 2>/dev/null; stopped=""
  [ $rc -ne 0 ] || { echo "FAIL ($name): exit status 0"; cat "$out"; exit 1; }
  local line
  line=$(grep '^shardgpt: error: rank 0: ' "$out" | head -1)
  [ -n "$line" ] || { echo "FAIL ($name): no error line from rank 0"; cat "$out"; exit 1; }
  for want in "MPI_" "step " "made no progress for 10 s" "rank(s) 1 "; do
    grep -qF -- "$want" <<<"$line" || { echo "FAIL ($name): the line lacks '$want': $line"; cat "$out"; exit 1; }
  done
  grep -qE -- "rank\(s\) 1 (did not arrive|arrived but sent nothing for [0-9]+ s)" <<<"$line" ||
    { echo "FAIL ($name): the line says neither that rank 1 did not arrive nor that it fell silent: $line"; cat "$out"; exit 1; }
  # the stopped rank, resumed by mpirun before its kill, must not accuse its peers from the notes
  # it heard before its pause (its own loop sees the gap and restarts its deadline)
  if grep -E '^shardgpt: error: rank 1: .*(did not arrive|arrived but sent nothing)' "$out"; then
    echo "FAIL ($name): the stopped rank 1 named its peers"; cat "$out"; exit 1
  fi
  echo "ok   $name: job ended with status $rc: $line"
}

run_case stop-rank1

# 3 ranks at ZeRO-3 with flight dumps, rank 2 SIGSTOPped after a step: every rank whose watchdog
# expires writes its dump; the first to claim the job's verdict asks the others for theirs,
# waits (bounded) and prints the one verdict line, which names rank 2; any other expired rank
# prints a line naming the claiming rank; no line names rank 0 or 1 as the culprit, and no rank
# states its own view of its peers.
#   stopped  rank 2 stays stopped: it never answers, the verdict is no-dump naming it
#   resumed  rank 2 is resumed once the verdict is claimed (a file in the dump folder: an event),
#            while the claiming rank still waits for the dumps: rank 2 answers with its dump and
#            names no peer. Its clock jumped (its pause sentinel looks every heartbeat, wherever
#            the stop caught it), so it says it was paused and so does its dump: the verdict is
#            paused naming it.
stop3() {
  local mode=$1 name=stop3-rank2-$1 log="$T/stop3-$1.jsonl" out="$T/stop3-$1.out"
  mpirun -np 3 --oversubscribe "$BIN" train $ARGS --zero-stage 3 --comm-timeout 10 --flight-dir "$T/flight-$mode" \
    --log "$log" > "$out" 2>&1 &
  local mpid=$!
  for i in $(seq 1 600); do [ -s "$log" ] && break; sleep 0.1; done
  [ -s "$log" ] || { echo "FAIL ($name): no step logged"; kill -9 $mpid; exit 1; }
  local victim="" p r
  for p in $(pgrep -f "shardgpt train.*$log" | grep -v "^$mpid\$"); do
    r=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = 2 ] && victim=$p
  done
  [ -n "$victim" ] || { echo "FAIL ($name): rank 2 not found"; kill -9 $mpid; exit 1; }
  kill -STOP "$victim"; stopped=$victim
  if [ "$mode" = resumed ]; then
    for i in $(seq 1 1200); do ls "$T/flight-$mode"/verdict_*.lead >/dev/null 2>&1 && break; sleep 0.1; done
    ls "$T/flight-$mode"/verdict_*.lead >/dev/null 2>&1 || { echo "FAIL ($name): no verdict claimed"; kill -9 $mpid; exit 1; }
    kill -CONT "$victim"
  fi
  # the watchdog (10 s), the bounded wait for dumps (10 s) and the verdict: bounded far above
  for i in $(seq 1 1800); do kill -0 $mpid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $mpid 2>/dev/null; then echo "FAIL ($name): the job still runs 180 s after rank 2 was stopped"; kill -9 $mpid; exit 1; fi
  wait $mpid; local rc=$?
  kill -9 $victim 2>/dev/null; stopped=""
  [ $rc -ne 0 ] || { echo "FAIL ($name): exit status 0"; cat "$out"; exit 1; }
  local n line want="(no-dump|not-arrived)"
  [ "$mode" = resumed ] && want="paused: culprit rank\(s\) 2\b"
  n=$(grep -c "the job's verdict from the flight dumps" "$out")
  [ "$n" -eq 1 ] || { echo "FAIL ($name): $n job verdict lines, expected 1"; cat "$out"; exit 1; }
  line=$(grep "the job's verdict from the flight dumps" "$out")
  grep -qE "^shardgpt: error: rank [01]: .*made no progress for 10 s.*: $want" <<<"$line" ||
    { echo "FAIL ($name): the job's verdict is not /$want/: $line"; cat "$out"; exit 1; }
  if grep -E "this rank's view|culprit rank\(s\) [^:]*\b[01]\b|rank\(s\) [^;]*\b[01]\b[^;]* (did not arrive|arrived but sent)" "$out"; then
    echo "FAIL ($name): a line names a healthy rank, or a rank states its own view"; cat "$out"; exit 1
  fi
  # the stopped rank's only error line, if any, is its own pause (mpirun resumes it before its
  # kill, or the test does); resumed by the test, its dump says so too and the verdict is paused
  if grep -E "^shardgpt: error: rank 2: " "$out" | grep -vqE ": this rank was paused for [0-9.]+ s \(its own clock jumped past [0-9]+ heartbeats\); not naming peers$"; then
    echo "FAIL ($name): rank 2 printed an error line other than its own pause"; cat "$out"; exit 1
  fi
  if [ "$mode" = resumed ] && ! grep -qE "^shardgpt: error: rank 2: this rank was paused" "$out"; then
    echo "FAIL ($name): rank 2, resumed, does not say it was paused"; cat "$out"; exit 1
  fi
  echo "ok   $name: job ended with status $rc: $line"
}
stop3 stopped
stop3 resumed
echo "mpi_watchdog ok"
