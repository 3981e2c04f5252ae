#!/usr/bin/env bash
# Checkpoint / resume through the executable (DESIGN.md invariants 4 and 5):
#  - same ranks and stage: the resumed run is bitwise identical (every loss, the final model);
#  - 2 ranks stage 1 -> 3 ranks stage 3, 4 -> 1, 1 -> 4 (same global batch): same data order,
#    losses within 1e-3 of the uninterrupted run;
#  - flat 2 ranks stage 2 <-> per-param 3 ranks stage 3 (--shard-layout), within 1e-3 too, and a
#    per-param checkpoint exports to the model it saved;
#  - another model config is refused naming the field;
#  - kill -9 during training with a checkpoint every step never leaves an unloadable latest.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 400 "In the beginning God created the heaven and the earth. And the earth was without form, and void."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
COMMON="--data $T/data/train.bin --seq-len 32 --steps 8 --lr 3e-3 --seed 5 --quiet --n-layer 2 --n-embd 64 --n-head 4"
train() {  # train NP B STAGE LOG [flags]
  local np=$1 b=$2 stage=$3 log=$4; shift 4
  mpirun -np "$np" --oversubscribe "$BIN" train $COMMON --micro-batch "$b" --zero-stage "$stage" --log "$log" "$@" >/dev/null
}
train 2 6 1 "$T/full.jsonl" --save-model "$T/full.bin" --ckpt-dir "$T/cfull"
# export: the consolidated HDF5 (read with h5py) and the llm.c .bin equal the saved model bitwise
"$BIN" export "$T/cfull" --out "$T/exp.h5" --llmc "$T/exp.bin" >/dev/null
cmp "$T/full.bin" "$T/exp.bin" || { echo "FAIL: exported llm.c model differs from --save-model"; exit 1; }
/usr/bin/python3 - "$T/exp.h5" "$T/exp.bin" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
names = []
f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert len(names) == 2 + 2 * 12 + 2, names
wte = f["wte.weight"][...] if "wte.weight" in f else f[[n for n in names if n.endswith("wte.weight")][0]][...]
assert wte.shape == (256, 64), wte.shape
raw = np.fromfile(sys.argv[2], dtype=np.float32, offset=1024, count=wte.size).reshape(wte.shape)
assert np.array_equal(raw, wte)
print("export ok:", len(names), "tensors, wte", wte.shape)
PY
a=$("$BIN" sample --checkpoint "$T/cfull" -n 30 --seed 9); b=$("$BIN" sample --model-file "$T/exp.bin" -n 30 --seed 9)
[ "$a" = "$b" ] || { echo "FAIL: sample from checkpoint and from export differ"; exit 1; }
# same ranks and stage, interrupted after step 4
train 2 6 1 "$T/a1.jsonl" --ckpt-dir "$T/ca" --stop-at-step 4
train 2 6 1 "$T/a2.jsonl" --ckpt-dir "$T/ca" --resume latest --save-model "$T/resumed.bin"
cmp "$T/full.bin" "$T/resumed.bin" || { echo "FAIL: resumed final model differs from the uninterrupted one"; exit 1; }
"$BIN" ckpt verify "$T/ca" >/dev/null
# a resume with nothing left to do is an error, not a silent no-op
out=$(mpirun -np 2 --oversubscribe "$BIN" train $COMMON --micro-batch 6 --zero-stage 1 --ckpt-dir "$T/ca" --resume latest --steps 8 2>&1) \
  && { echo "FAIL: --steps at the checkpoint's step was accepted"; exit 1; }
grep -q '^shardgpt: error: --steps 8 is at or below the step 8' <<<"$out" || { echo "FAIL: $out" | head -3; exit 1; }
out=$(mpirun -np 2 --oversubscribe "$BIN" train $COMMON --micro-batch 6 --zero-stage 1 --ckpt-dir "$T/cfull" --resume "$T/ca/step_00000004" --stop-at-step 3 2>&1) \
  && { echo "FAIL: --stop-at-step below the resumed step was accepted"; exit 1; }
grep -q '^shardgpt: error: --stop-at-step 3 is at or below the resumed step 4' <<<"$out" || { echo "FAIL: $out" | head -3; exit 1; }
# (into a file: `| grep -q` would end the pipe early, and pipefail would see inspect's SIGPIPE)
"$BIN" ckpt inspect "$T/ca/step_00000004" > "$T/inspect.txt"
grep -q "step" "$T/inspect.txt"
# other rank counts and stages, from the same step-4 checkpoint or a new one
train 3 4 3 "$T/b2.jsonl" --ckpt-dir "$T/cb" --resume "$T/ca/step_00000004"
train 4 3 2 "$T/c1.jsonl" --ckpt-dir "$T/cc" --stop-at-step 4
train 1 12 0 "$T/c2.jsonl" --ckpt-dir "$T/cc" --resume latest
train 1 12 0 "$T/d1.jsonl" --ckpt-dir "$T/cd" --stop-at-step 4
train 4 3 3 "$T/d2.jsonl" --ckpt-dir "$T/cd" --resume latest
/usr/bin/python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
L = lambda f: [json.loads(l)["loss"] for l in open(f"{d}/{f}")]
full = L("full.jsonl")
assert L("a1.jsonl") + L("a2.jsonl") == full, "same-config resume must be bitwise identical"
for name, tail in [("2->3 stage 1->3", L("b2.jsonl")), ("4->1", L("c2.jsonl")), ("1->4", L("d2.jsonl"))]:
    diff = max(abs(a - b) for a, b in zip(tail, full[4:]))
    assert len(tail) == 4 and diff < 1e-3, (name, tail, full[4:])
    print(f"{name}: max loss difference {diff:.2e}")
for f in ["c1.jsonl", "d1.jsonl"]:
    assert max(abs(a - b) for a, b in zip(L(f), full[:4])) < 1e-3, f
PY
# shard layouts: flat 2 ranks stage 2 -> per-param 3 ranks stage 3 and back; a per-param run
# trains like the flat one, and its checkpoint exports to the model it saved
train 2 6 2 "$T/e1.jsonl" --ckpt-dir "$T/ce" --stop-at-step 4
train 3 4 3 "$T/e2.jsonl" --ckpt-dir "$T/ce" --resume latest --shard-layout per-param
train 3 4 3 "$T/f1.jsonl" --ckpt-dir "$T/cf" --stop-at-step 4 --shard-layout per-param
train 2 6 2 "$T/f2.jsonl" --ckpt-dir "$T/cf" --resume latest
info=$("$BIN" ckpt inspect "$T/cf/step_00000004")
grep -q "shard layout per-param" <<<"$info" || { echo "FAIL: inspect does not show the layout"; exit 1; }
train 3 4 3 "$T/g.jsonl" --shard-layout per-param --save-model "$T/pp.bin" --ckpt-dir "$T/cg"
"$BIN" export "$T/cg" --out "$T/pp_exp.h5" --llmc "$T/pp_exp.bin" >/dev/null
cmp "$T/pp.bin" "$T/pp_exp.bin" || { echo "FAIL: export of a per-param checkpoint differs from --save-model"; exit 1; }
/usr/bin/python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
J = lambda f: [json.loads(l) for l in open(f"{d}/{f}")]
L = lambda f: [r["loss"] for r in J(f)]
full = L("full.jsonl")
for name, run in [("flat s2 N2 -> per-param s3 N3", L("e1.jsonl") + L("e2.jsonl")),
                  ("per-param s3 N3 -> flat s2 N2", L("f1.jsonl") + L("f2.jsonl")), ("per-param s3 N3", L("g.jsonl"))]:
    diff = max(abs(a - b) for a, b in zip(run, full))
    assert len(run) == 8 and diff < 1e-3, (name, run, full)
    print(f"{name}: max loss difference {diff:.2e}")
layouts = {r.get("shard_layout") for r in J("g.jsonl")} - {None}
assert layouts == {"per-param"}, layouts
PY
# another model is refused, naming the field, and nothing is written
out=$(mpirun -np 2 --oversubscribe "$BIN" train $COMMON --n-layer 3 --micro-batch 6 --ckpt-dir "$T/ca" --resume latest 2>&1 >/dev/null) && { echo "FAIL: config mismatch accepted"; exit 1; }
grep -q "n_layer" <<<"$out" || { echo "FAIL: mismatch message does not name n_layer: $out"; exit 1; }
# kill -9 at arbitrary moments of a run that checkpoints every step: latest stays loadable
BIG="--data $T/data/train.bin --seq-len 64 --micro-batch 4 --n-layer 4 --n-embd 256 --n-head 4 --steps 100000 --quiet"
for delay in 1.5 2.3 3.1; do
  rm -rf "$T/ck"
  mpirun -np 2 --oversubscribe "$BIN" train $BIG --ckpt-dir "$T/ck" --ckpt-every 1 --keep-last 2 >/dev/null 2>&1 &
  pid=$!
  sleep $delay
  pkill -9 -f "shardgpt train.*$T/ck" || true
  wait $pid 2>/dev/null || true
  if [ -e "$T/ck/latest" ]; then
    "$BIN" ckpt verify "$T/ck" >/dev/null || { echo "FAIL: latest unloadable after kill -9 at ${delay}s"; exit 1; }
    step=$(sed 's/step_0*//' "$T/ck/latest")
    mpirun -np 2 --oversubscribe "$BIN" train $BIG --ckpt-dir "$T/ck" --resume latest --stop-at-step $((step + 1)) >/dev/null
    echo "kill -9 after ${delay}s: latest was step $step: verified, resumed and checkpointed again ($(ls "$T/ck" | tr '\n' ' '))"
  else
    echo "kill -9 after ${delay}s: before the first checkpoint"
  fi
done
echo "resume ok"
