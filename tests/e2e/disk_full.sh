#!/usr/bin/env bash
# A full disk. On a small tmpfs this test mounts (and unmounts):
#  - the JSONL --log fills up: every rank exits non-zero with one error line naming the path
#    and strerror; the log keeps whole rows only; the checkpoint state is untouched (the
#    previous checkpoint still verifies). 1 and 2 ranks.
#  - a checkpoint save fills the disk (sync and --async-ckpt, 2 ranks): one "no space left on
#    device writing ..." line, no crash at exit (HDF5's shutdown included), the
#    previous `latest` still verifies, no partial shard file left.
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
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "disk_full ok"
