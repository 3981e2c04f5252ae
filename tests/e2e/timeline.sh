#!/usr/bin/env bash
# The timeline (--trace DIR --trace-steps A:B, docs/DIAGNOSE.md) on 2 ranks: each rank's
# trace_rank_XXXXX.json is valid JSON whose phase spans are of steps A..B only (forward and
# backward spans naming their unit, collectives on their communicator's track);
# `diagnose --merge-trace` merges both ranks' tracks into one file; scripts/plot.py --trace
# draws it as a PNG (skipped without matplotlib). Then the merge's refusals: no traces, traces
# of two runs, a truncated file (one line each, exit 1).
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
SRC=$2
e2e_prepare 400 "In the beginning God created the heaven and the earth."
ARGS="--data $T/data/train.bin --n-layer 2 --n-embd 32 --n-head 2 --seq-len 16 --micro-batch 2 --steps 6 --quiet --threads 1"

timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --grad-accum 2 --zero-stage 3 --trace "$T/tr" --trace-steps 3:4 \
  > "$T/run.out" 2>&1 || { cat "$T/run.out"; fail "the traced run failed"; }
python3 - "$T/tr" <<'PY' || fail "the per-rank traces"
import json, sys
for rank in (0, 1):
    j = json.load(open(f"{sys.argv[1]}/trace_rank_{rank:05d}.json"))
    o = j["otherData"]
    assert o["schema"] == "shardgpt-trace" and o["version"] == 1 and o["world_rank"] == rank and o["steps"] == [3, 4], o
    spans = [e for e in j["traceEvents"] if e["ph"] == "X"]
    phases = [e for e in spans if e["cat"] == "phase"]
    colls = [e for e in spans if e["cat"] == "collective"]
    assert {e["args"]["step"] for e in phases} == {3, 4}, {e["args"]["step"] for e in phases}
    assert {e["args"]["step"] for e in colls} <= {3, 4} and colls, len(colls)
    assert all(e["pid"] == rank and e["tid"] == 0 for e in phases)
    assert all(e["tid"] >= 1 for e in colls)
    names = {e["name"] for e in phases}
    assert {"data", "forward h.0", "backward h.1", "grad_sync", "optimizer"} <= names, names
    assert {e["args"]["micro"] for e in phases if e["name"].startswith("forward")} == {0, 1}
    assert any(e["name"].startswith("all_gather h.") for e in colls), {e["name"] for e in colls}
    tracks = {e["args"]["name"] for e in j["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "phases" in tracks and "comm world" in tracks, tracks
PY
echo "ok   per-rank traces: steps 3-4 only"

"$BIN" diagnose --merge-trace "$T/tr" > "$T/merge.out" 2>&1 || { cat "$T/merge.out"; fail "merge: exit status $?"; }
grep -q "merged the traces of 2 rank(s) into $T/tr/trace_merged.json" "$T/merge.out" || { cat "$T/merge.out"; fail "merge: its line"; }
python3 - "$T/tr/trace_merged.json" <<'PY' || fail "merge: not both ranks' tracks"
import json, sys
j = json.load(open(sys.argv[1]))
procs = {e["pid"]: e["args"]["name"] for e in j["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
assert sorted(procs) == [0, 1] and procs[1].startswith("rank 1 ("), procs
x = [e for e in j["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in x} == {0, 1} and min(e["ts"] for e in x) == 0
assert j["otherData"]["ranks"] == [0, 1]
PY
echo "ok   merge: both ranks"

if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  "$SRC"/scripts/plot.py --trace "$T/tr/trace_merged.json" -o "$T/t.png" > /dev/null || fail "plot.py --trace failed"
  [ "$(head -c 8 "$T/t.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "plot.py: not a PNG"
  [ "$(stat -c %s "$T/t.png")" -gt 10000 ] || fail "plot.py: a PNG of no real size"
  echo "ok   plot.py --trace: a PNG"
else
  echo "skip plot.py --trace: python3-matplotlib is not installed"
fi

# refusals: one line naming the folder or file, exit 1
refuse() {  # NAME PATTERN: diagnose --merge-trace $T/NAME fails with one line matching PATTERN
  "$BIN" diagnose --merge-trace "$T/$1" > "$T/e.out" 2>&1
  local rc=$?
  [ $rc -eq 1 ] && grep -q -- "$2" "$T/e.out" && [ "$(wc -l < "$T/e.out")" -eq 1 ] || { cat "$T/e.out"; fail "$1: status $rc"; }
  echo "ok   refused $1"
}
mkdir "$T/empty"
refuse empty "no traces here"
timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --trace "$T/tr2" --trace-steps 1:1 > "$T/run2.out" 2>&1 ||
  { cat "$T/run2.out"; fail "the second traced run failed"; }
mkdir "$T/mixed" && cp "$T/tr/trace_rank_00000.json" "$T/mixed/" && cp "$T/tr2/trace_rank_00001.json" "$T/mixed/"
refuse mixed "traces of different runs"
mkdir "$T/trunc" && head -c 300 "$T/tr/trace_rank_00000.json" > "$T/trunc/trace_rank_00000.json"
refuse trunc "trace_rank_00000.json: not a complete trace"
# --trace-steps without --trace, or backwards: refused before any work
"$BIN" train $ARGS --trace-steps 3:4 > "$T/e.out" 2>&1 && fail "--trace-steps without --trace accepted"
grep -q -- "--trace-steps 3:4 needs --trace DIR" "$T/e.out" || { cat "$T/e.out"; fail "--trace-steps without --trace: its line"; }
"$BIN" train $ARGS --trace "$T/tr3" --trace-steps 4:3 > "$T/e.out" 2>&1 && fail "--trace-steps 4:3 accepted"
grep -q -- "expected A:B" "$T/e.out" || { cat "$T/e.out"; fail "--trace-steps 4:3: its line"; }
echo "timeline ok"
