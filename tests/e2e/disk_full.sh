#!/usr/bin/env bash
# A full disk. On a small tmpfs this test mounts (and unmounts):
#  - the JSONL --log fills up: every rank exits non-zero with one error line naming the path
#    and strerror; the log keeps whole rows only; the checkpoint state is untouched (the
#    previous checkpoint still verifies). 1 and 2 ranks.
#  - a checkpoint save fills the disk (sync and --async-ckpt, 2 ranks): the periodic saves fail
#    --ckpt-fail-limit (3) times in a row, then one error line naming "no space left on device
#    writing ...", status 75, no crash at exit (HDF5's shutdown included), the previous
#    `latest` still verifies, no partial shard file left.
#  - a periodic save on a full disk is a warning on every rank and training goes on: the disk
#    freed after the first failure (the run holds until the test has freed it:
#    SHARDGPT_TEST_HOLD_WHILE_EXISTS), the next save succeeds, the JSONL records the failure;
#    a disk that stays full ends the run after --ckpt-fail-limit 2 failures with status 75.
#  - export --out onto a full disk: the same line, no crash, no e.h5.tmp left.
# Skipped (status 77, reason printed) where mounting is not permitted.
set -u
BIN=$1
T=$(mktemp -d)
MNT="$T/mnt"
mkdir -p "$MNT"
cleanup() { mountpoint -q "$MNT" && umount "$MNT"; rm -rf "$T"; }
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! mount -t tmpfs -o size=64k tmpfs "$MNT" 2>"$T/mount.err"; then
  echo "SKIP: cannot mount a tmpfs here ($(head -1 "$T/mount.err")); the disk-full cases need one"
  exit 77
fi
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 400) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
M="--data $T/data/train.bin --n-layer 1 --n-embd 32 --n-head 2 --seq-len 16 --micro-batch 2"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
# one_error OUT: exactly one "shardgpt: error:" line, no crash report
one_error() {
  local n; n=$(grep -c '^shardgpt: error:' <<<"$1")
  [ "$n" -eq 1 ] && ! grep -qiE 'segmentation|signal 11|core dumped|H5F__close_cb|HDF5-DIAG' <<<"$1"
}
remount() { umount "$MNT" && mount -t tmpfs -o "size=$1" tmpfs "$MNT"; }

# ---- 1: the JSONL log on a 64 KiB tmpfs, 1 and 2 ranks; checkpoints elsewhere ----
for np in 1 2; do
  remount 64k
  rm -rf "$T/ck"
  out=$(timeout 300 mpirun -np $np --oversubscribe "$BIN" train $M --steps 400 --ckpt-dir "$T/ck" --ckpt-every 50 \
        --log "$MNT/l.jsonl" --quiet 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "log full, $np rank(s): exit status $rc (expected an error)"; continue; fi
  one_error "$out" || { fail "log full, $np rank(s): not one error line"; echo "$out" | head; continue; }
  grep -q "^shardgpt: error: --log $MNT/l.jsonl: .*No space left on device" <<<"$out" \
    || { fail "log full, $np rank(s): the line names no path/strerror"; echo "$out" | head -3; }
  rows=$(/usr/bin/python3 - "$MNT/l.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]   # every row whole: a cut row would not parse
assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), "steps not 1..n"
print(len(rows))
PY
) || { fail "log full, $np rank(s): the log has a cut or missing row"; continue; }
  before=$fails
  "$BIN" ckpt verify "$T/ck" >/dev/null || fail "log full, $np rank(s): the checkpoint does not verify"
  last=$(sed 's/step_0*//' "$T/ck/latest")
  [ "$last" -le "$rows" ] || fail "log full: checkpoint at step $last beyond the last logged row $rows"
  [ $fails -eq $before ] && echo "ok   log full, $np rank(s): $(grep '^shardgpt: error:' <<<"$out"); $rows whole rows kept, latest checkpoint step $last verifies"
done

# ---- 2: the checkpoint directory fills up (2 ranks, --ckpt-every 2), sync and async ----
for mode in sync async; do
  before=$fails
  remount 2m
  extra=""; [ $mode = async ] && extra="--async-ckpt"
  out=$(timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $M --n-embd 64 --n-layer 2 --steps 200 --ckpt-dir "$MNT/ck" \
        --ckpt-every 2 $extra --quiet 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "ckpt full ($mode): exit status $rc"; continue; fi
  one_error "$out" || { fail "ckpt full ($mode): not one error line, or a crash"; echo "$out" | head; continue; }
  grep -q "no space left on device writing $MNT/ck/.*bytes needed" <<<"$out" \
    || { fail "ckpt full ($mode): no 'no space left on device writing ...' line"; echo "$out" | head -3; }
  [ $rc -ne 139 ] && [ $rc -lt 128 ] || fail "ckpt full ($mode): killed by a signal (status $rc)"
  if [ -e "$MNT/ck/latest" ]; then
    "$BIN" ckpt verify "$MNT/ck" >/dev/null || fail "ckpt full ($mode): the previous latest does not verify"
  fi
  [ $fails -eq $before ] && echo "ok   ckpt full ($mode): rc $rc: $(grep '^shardgpt: error:' <<<"$out")"
done

# ---- 2b: export onto a full disk ----
rm -rf "$T/ck"
"$BIN" train $M --n-embd 64 --n-layer 2 --steps 2 --ckpt-dir "$T/ck" --quiet >/dev/null || { echo "setup failed"; exit 1; }
remount 64k
out=$("$BIN" export "$T/ck" --out "$MNT/e.h5" 2>&1); rc=$?
before=$fails
if [ $rc -eq 0 ]; then fail "export full: exit 0"
else
  one_error "$out" || { fail "export full: not one error line, or a crash (rc $rc)"; echo "$out" | head; }
  grep -q "no space left on device writing $MNT/e.h5.tmp, .* bytes needed" <<<"$out" || { fail "export full: message"; echo "$out" | head -3; }
  [ ! -e "$MNT/e.h5.tmp" ] && [ ! -e "$MNT/e.h5" ] || fail "export full: a partial file is left: $(ls "$MNT")"
  [ $fails -eq $before ] && echo "ok   export full: rc $rc: $(grep '^shardgpt: error:' <<<"$out"); nothing left in $MNT"
fi
# ---- 3: a periodic checkpoint fails on a full disk: a warning, training goes on ----
# fill MNT but 64 KiB (room for the directory's lock, not for a checkpoint)
fill() { local avail; avail=$(df --output=avail -B1 "$MNT" | tail -1); head -c $((avail - 65536)) /dev/zero > "$MNT/filler"; }
# 3a: the disk is freed after the first failure (the run holds there until the filler is gone:
# an event, not a delay); the next save succeeds, the run ends normally
remount 8m; mkdir -p "$MNT/ck"; fill
rm -f "$T/r.jsonl"; : > "$T/r.out"
SHARDGPT_TEST_HOLD_WHILE_EXISTS="$MNT/filler" timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $M --n-embd 64 \
  --n-layer 2 --steps 6 --ckpt-dir "$MNT/ck" --ckpt-every 2 --log "$T/r.jsonl" --quiet >"$T/r.out" 2>&1 & run=$!
for _ in $(seq 1 3000); do grep -q 'test hook: holding after a failed checkpoint' "$T/r.out" && break; kill -0 $run 2>/dev/null || break; sleep 0.1; done
rm -f "$MNT/filler"
wait $run; rc=$?
out=$(cat "$T/r.out")
before=$fails
[ $rc -eq 0 ] || fail "ckpt fails then room: exit status $rc (expected 0)"
[ "$(grep -c '^shardgpt: warning: rank [01]: checkpoint of step 2 not saved' <<<"$out")" -eq 2 ] \
  || { fail "ckpt fails then room: not one warning per rank"; echo "$out" | head -5; }
! grep -q '^shardgpt: error:' <<<"$out" || fail "ckpt fails then room: an error line"
[ "$(cat "$MNT/ck/latest" 2>/dev/null)" = step_00000006 ] || fail "ckpt fails then room: latest is not step 6"
[ -d "$MNT/ck/step_00000004" ] || fail "ckpt fails then room: the next periodic save (step 4) is missing"
[ ! -e "$MNT/ck/step_00000002" ] || fail "ckpt fails then room: the failed step 2 was published"
! ls -a "$MNT/ck" | grep -q '^\.tmp\.' || fail "ckpt fails then room: a partial save is left: $(ls -a "$MNT/ck")"
"$BIN" ckpt verify "$MNT/ck" >/dev/null || fail "ckpt fails then room: latest does not verify"
/usr/bin/python3 - "$T/r.jsonl" <<'PY' || fail "ckpt fails then room: the log does not record the failure"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 7)), [r["step"] for r in rows]
failed = [(r["step"], f["step"]) for r in rows for f in r.get("ckpt_failed", [])]
assert failed == [(3, 2)], failed
assert "space" in rows[2]["ckpt_failed"][0]["error"], rows[2]["ckpt_failed"]
PY
[ $fails -eq $before ] && echo "ok   ckpt fails then room: $(grep -m1 '^shardgpt: warning:' <<<"$out" | cut -c1-160)...; latest step 6 verifies"
# 3b: the disk stays full: --ckpt-fail-limit 2 failures in a row end the run with status 75
remount 8m; mkdir -p "$MNT/ck"; fill
rm -f "$T/r.jsonl"
out=$(timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $M --n-embd 64 --n-layer 2 --steps 20 --ckpt-dir "$MNT/ck" \
      --ckpt-every 2 --ckpt-fail-limit 2 --log "$T/r.jsonl" --quiet 2>&1); rc=$?
before=$fails
[ $rc -eq 75 ] || fail "ckpt fail limit: exit status $rc (expected 75)"
one_error "$out" || { fail "ckpt fail limit: not one error line"; echo "$out" | head; }
grep -q '^shardgpt: error: checkpoint saves failed 2 time(s) in a row (--ckpt-fail-limit 2' <<<"$out" \
  || { fail "ckpt fail limit: the line"; echo "$out" | grep error; }
[ ! -e "$MNT/ck/latest" ] || fail "ckpt fail limit: a latest appeared"
/usr/bin/python3 - "$T/r.jsonl" <<'PY' || fail "ckpt fail limit: the log does not record the first failure"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [f["step"] for r in rows for f in r.get("ckpt_failed", [])] == [2], rows
PY
[ $fails -eq $before ] && echo "ok   ckpt fail limit: rc 75: $(grep '^shardgpt: error:' <<<"$out")"
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "disk_full ok"
