#!/usr/bin/env bash
# --resume auto falls back to the newest checkpoint that loads (and `latest` follows one
# rule). Checkpoints at steps 2 and 4 saved by 2 ranks (ZeRO 1), or by 3 (ZeRO 3);
# step 4 damaged in each kind of place:
#  - one byte of a shard's master, m or v dataset, one byte of the index, a missing shard file,
#    a truncated one: --resume auto warns once naming the file and the reason, renames it
#    step_00000004.bad-<reason>, resumes step 2, and the run is bitwise the run that resumed
#    step 2 directly (every loss, the final model), on 3 ranks at stage 3 (2 -> 3), on 2 (2 -> 2)
#    and from a 3-rank save on 2 ranks (3 -> 2); the JSONL's first row and the resume line say
#    what was resumed and what was skipped; latest names the checkpoint resumed;
#  - --resume latest and --resume PATH on the damaged one: an error with the --resume auto hint;
#  - every checkpoint damaged: one error line listing each and why, exit 1 (final for the
#    sbatch templates: they requeue on 75 only), nothing renamed;
#  - latest empty / a dangling symlink: --resume auto warns and resumes the newest complete
#    step; --resume latest is an error naming latest.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_prepare 300 "In the beginning God created the heaven and the earth. And the earth was without form."
F="--data $T/data/train.bin --seq-len 32 --steps 6 --lr 3e-3 --seed 5 --quiet --n-layer 2 --n-embd 64 --n-head 4"
# train NP STAGE [flags]: the same global batch (12 sequences) on 2 or 3 ranks
train() {
  local np=$1 stage=$2; shift 2
  mpirun -np "$np" --oversubscribe "$BIN" train $F --micro-batch $((12 / np)) --zero-stage "$stage" --threads 1 "$@"
}
# flip DIR FILE DATASET: one byte inside the first chunk of dataset 0/1/2 (master/m/v) of shard
# file FILE, at the offset the index records
flip() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
d, f, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
raw = open(d + "/index.h5", "rb").read()
n = int([l for l in raw[:128].decode("ascii", "replace").split("\n") if l.startswith("json ")][0].split()[1])
fi = json.loads(raw[128:128 + n])["plan"]["files"][f]
p, off = d + "/" + fi["name"], fi["chunks"][k][0] + 40
b = bytearray(open(p, "rb").read()); b[off] ^= 4; open(p, "wb").write(b)
PY
}

# the checkpoints (steps 2 and 4), and the references: step 2 resumed directly
train 2 1 --ckpt-dir "$T/base2" --ckpt-every 2 --stop-at-step 4 >/dev/null || fail "2-rank save"
train 3 3 --ckpt-dir "$T/base3" --ckpt-every 2 --stop-at-step 4 >/dev/null || fail "3-rank save"
ref() {  # ref NAME BASE NP STAGE
  cp -r "$T/$2" "$T/ref_$1"
  train "$3" "$4" --ckpt-dir "$T/ref_$1" --resume "$T/ref_$1/step_00000002" --log "$T/ref_$1.jsonl" \
    --save-model "$T/ref_$1.bin" >/dev/null || fail "reference $1"
}
ref 2to3 base2 3 3
ref 2to2 base2 2 1
ref 3to2 base3 2 2

# case NAME BASE NP STAGE REF REASON DAMAGE...: damage step 4 of a copy of BASE, resume it with auto
case_run() {
  local name=$1 base=$2 np=$3 stage=$4 ref=$5 reason=$6; shift 6
  local c=$T/c_$name
  cp -r "$T/$base" "$c"
  "$@" "$c/step_00000004" || fail "$name: damaging"
  out=$(train "$np" "$stage" --ckpt-dir "$c" --resume auto --log "$c.jsonl" --save-model "$c.bin" 2>&1) \
    || fail "$name: --resume auto failed: $out"
  warn=$(grep -c "^shardgpt: warning:" <<<"$out")
  [ "$warn" = 1 ] || fail "$name: $warn warning lines, expected 1: $out"
  grep -q "^shardgpt: warning: --resume auto: skipped $c/step_00000004 ($reason): $c/step_00000004/.*; renamed to $c/step_00000004.bad-$reason\$" <<<"$out" \
    || fail "$name: no warning naming the file and '$reason': $out"
  grep -q "^resumed from $c/step_00000002 at step 2 .*; skipped damaged: $c/step_00000004 ($reason, now $c/step_00000004.bad-$reason)\$" <<<"$out" \
    || fail "$name: no resume line naming both: $out"
  [ -d "$c/step_00000004.bad-$reason" ] && [ ! -e "$c/step_00000004" ] || fail "$name: step 4 not renamed: $(ls "$c")"
  cmp -s "$c.bin" "$T/ref_$ref.bin" || fail "$name: final model differs from the run that resumed step 2 directly"
  /usr/bin/python3 - "$c.jsonl" "$T/ref_$ref.jsonl" "$c" "$reason" <<'PY' || exit 1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
c, reason = sys.argv[3], sys.argv[4]
assert [r["step"] for r in a] == [3, 4, 5, 6], [r["step"] for r in a]
assert [r["loss"] for r in a] == [r["loss"] for r in b], "losses differ from the direct resume of step 2"
res = a[0]["resume"]
assert res["from"] == c + "/step_00000002", res
assert [(s["dir"], s["reason"], s["renamed_to"]) for s in res["skipped"]] == \
    [(c + "/step_00000004", reason, c + "/step_00000004.bad-" + reason)], res
assert all("resume" not in r for r in a[1:])
PY
  # the final save points latest at step 6
  [ "$(cat "$c/latest")" = step_00000006 ] || fail "$name: latest is $(cat "$c/latest")"
  echo "  $name: step 4 skipped ($reason) and renamed; step 2 resumed on $np rank(s), stage $stage: bitwise the direct resume"
}
# damage commands: the step directory comes last
d_flip() { flip "$3" "$1" "$2"; }                                      # d_flip FILE DATASET
d_byte() { /usr/bin/python3 -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[int(sys.argv[2])] ^= 1; open(p, 'wb').write(b)" "$2/$1" "$3"; }
d_index() { d_byte index.h5 "$1" 300; }
d_rm() { rm "$2/$1"; }
d_trunc() { truncate -s -100 "$2/$1"; }

echo "damaged step 4 -> --resume auto resumes step 2:"
case_run master    base2 3 3 2to3 checksum      d_flip 0 0
case_run m         base2 3 3 2to3 checksum      d_flip 1 1
case_run v         base2 2 1 2to2 checksum      d_flip 0 2
case_run index     base2 3 3 2to3 index         d_index
case_run missing   base2 2 1 2to2 missing-shard d_rm rank_00001.h5
case_run truncated base2 3 3 2to3 shard-size    d_trunc rank_00000.h5
case_run master32  base3 2 2 3to2 checksum      d_flip 2 0

# ---- an explicit choice that does not load is an error, with the hint ----
cp -r "$T/base2" "$T/x"; flip "$T/x/step_00000004" 0 0
for how in latest "$T/x/step_00000004"; do
  out=$(train 2 1 --ckpt-dir "$T/x" --resume "$how" 2>&1) && fail "--resume $how on a damaged checkpoint was accepted"
  grep -q "^shardgpt: error: $T/x/step_00000004/rank_00000.h5: .*checksum.* (--resume auto falls back to the newest checkpoint that loads)\$" <<<"$out" \
    || fail "--resume $how: $out"
done
[ -d "$T/x/step_00000004" ] && ! ls -d "$T"/x/*.bad-* 2>/dev/null || fail "an explicit --resume renamed something"
echo "--resume latest / PATH on the damaged step 4: error with the --resume auto hint, nothing renamed"

# ---- nothing loads: one error line listing each, exit 1 (final), nothing renamed ----
flip "$T/x/step_00000002" 1 2
out=$(train 2 1 --ckpt-dir "$T/x" --resume auto 2>&1); rc=$?
[ $rc = 1 ] || fail "exit status $rc when no checkpoint loads, expected 1: $out"
[ "$(grep -c '^shardgpt: error:' <<<"$out")" = 1 ] || fail "expected one error line: $out"
grep -q "^shardgpt: error: --resume auto: no checkpoint in $T/x loads (nothing renamed): $T/x/step_00000004 (checksum: $T/x/step_00000004/rank_00000.h5: .*); $T/x/step_00000002 (checksum: $T/x/step_00000002/rank_00001.h5: .*)\$" <<<"$out" \
  || fail "no error line listing both: $out"
[ -d "$T/x/step_00000004" ] && [ -d "$T/x/step_00000002" ] && ! ls -d "$T"/x/*.bad-* 2>/dev/null || fail "renamed when nothing loads"
echo "no checkpoint loads: exit 1, $(grep -c '^shardgpt: error:' <<<"$out") error line listing both, nothing renamed"

# ---- latest that cannot be used: auto warns and takes the newest complete step ----
for kind in empty dangling; do
  c=$T/l_$kind; cp -r "$T/base2" "$c"
  if [ $kind = empty ]; then : > "$c/latest"; what="latest: empty"; else rm "$c/latest"; ln -s nowhere "$c/latest"; what="latest: a dangling symlink"; fi
  out=$(train 2 1 --ckpt-dir "$c" --resume latest 2>&1) && fail "--resume latest with a $kind latest was accepted"
  grep -q "^shardgpt: error: $c/$what.*(--resume auto falls back" <<<"$out" || fail "--resume latest, $kind latest: $out"
  out=$(train 2 1 --ckpt-dir "$c" --resume auto --stop-at-step 5 2>&1) || fail "--resume auto with a $kind latest: $out"
  grep -q "^shardgpt: warning: --resume auto: $c/$what" <<<"$out" || fail "no warning naming latest ($kind): $out"
  grep -q "^resumed from $c/step_00000004 at step 4 " <<<"$out" || fail "did not resume the newest step ($kind): $out"
  [ -f "$c/latest" ] && [ ! -L "$c/latest" ] && [ "$(cat "$c/latest")" = step_00000005 ] || fail "latest not replaced ($kind)"
  echo "latest $kind: --resume latest refused naming it; --resume auto warned and resumed step 4"
done
echo "resume fallback ok"
