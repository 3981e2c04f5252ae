#!/usr/bin/env bash
# Every bad input gives exactly one "shardgpt: error:" line naming the problem, a non-zero
# exit on every rank, and no hang (each case runs under a timeout, on 2 ranks). The cases are
# independent (none writes what another reads) and run four at a time (tests/e2e/lib/checks.sh);
# the results are printed in the cases' order.
set -u
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 400) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
printf 'not a shard at all, just some bytes that are long enough to fill a header of 1024 bytes %.0s' $(seq 1 20) > "$T/bad.bin"
echo '{}' > "$T/model.bin"
fails=0
source "$(dirname "$0")/lib/checks.sh"
# check NAME EXPECTED_SUBSTRING -- ARGS...: on 2 ranks, within 60 s (lib/checks.sh)
check() { local name=$1 want=$2; shift 3; run_check "$name" "$want" 2 60 -- "$@"; }
D="--data $T/data/train.bin --steps 2 --seq-len 16 --micro-batch 2"
check unknown-flag      "--bogus"            -- train --bogus
check no-subcommand     "subcommand"         --
check stage-range       "zero-stage"         -- train $D --zero-stage 5
check dtype             "dtype"              -- train $D --dtype fp16
check compute-dtype     "compute-dtype"      -- train $D --compute-dtype fp16
check missing-data      "$T/nope"            -- train --data "$T/nope*.bin" --steps 1
check bad-magic         "bad.bin"            -- train --data "$T/bad.bin" --steps 1
check seq-too-long      "seq-len"            -- train $D --seq-len 4096
check reduce-grads      "reduce-grads"       -- train $D --zero-stage 1 --reduce-grads last-micro
check reduce-dtype      "reduce-dtype"       -- train $D --reduce-dtype bf16
check shard-layout      "--shard-layout"     -- train $D --shard-layout diagonal
# --device cuda with every GPU hidden: the no-GPU error in every build (no CUDA backend, a GPU
# machine, the CUDA emulation, which also reads CUDA_VISIBLE_DEVICES).
export CUDA_VISIBLE_DEVICES=
check cuda              "--device cuda"      -- train $D --device cuda
unset CUDA_VISIBLE_DEVICES
check lr-nan            "--lr"               -- train $D --lr nan
check lr-zero           "--lr"               -- train $D --lr 0
check clip-negative     "--grad-clip"        -- train $D --grad-clip -1
check min-lr-frac       "--min-lr-frac"      -- train $D --min-lr-frac 1.5
check val-batches-zero  "--val-batches"      -- train $D --val-batches 0
check n-layer-zero      "--n-layer"          -- train $D --n-layer 0
check keep-last-neg     "--keep-last"        -- train $D --keep-last -1
check seq-len-huge      "seq-len 100000000"  -- train $D --seq-len 100000000
check nccl-on-cpu       "--comm nccl"        -- train $D --comm nccl
check attention-name   "--attention"        -- train $D --attention flash
check gelu-name        "--gelu"             -- train $D --gelu epilogue
check gelu-recompute   "--gelu fused with --recompute gelu" -- train $D --gelu fused --recompute gelu
check attention-cpu    "--attention cudnn: needs --device cuda" -- train $D --attention cudnn
# --attention cudnn with every GPU hidden: refused for the build (no cuDNN frontend: CI, the
# emulation) or, where the cuDNN path is built, for the missing GPU.
export CUDA_VISIBLE_DEVICES=
check attention-cudnn  "no cuDNN frontend\|--device cuda: no usable GPU" -- train $D --attention cudnn --device cuda
unset CUDA_VISIBLE_DEVICES
check comm-timeout      "--comm-timeout"     -- train $D --comm-timeout 0
check init-missing      "$T/none.bin"        -- train $D --init "$T/none.bin"
check init-bad          "model.bin"          -- train $D --init "$T/model.bin"
check batch-tokens      "batch-tokens"       -- train $D --batch-tokens 1000
check n-embd-heads      "n-head"             -- train $D --n-embd 30 --n-head 4
check seed-negative     "--seed"             -- train $D --seed -1
check steps-hex         "--steps"            -- train $D --steps 0x10
check lr-nan            "--lr"               -- train $D --lr nan
check too-few-tokens    "need at least"      -- train $D --micro-batch 100000
check vocab-too-small   "vocab"              -- train $D --vocab-size 100
check preset            "preset"             -- train $D --model d7
check log-unwritable    "/nonexistent/dir"   -- train $D --log /nonexistent/dir/log.jsonl
# flags that mean nothing alone or in this combination: refused before any work, naming the flag
check wsd-decay-zero    "--wsd-decay-frac"   -- train $D --lr-schedule wsd --wsd-decay-frac 0
check wsd-decay-neg     "--wsd-decay-frac"   -- train $D --lr-schedule wsd --wsd-decay-frac -0.5
check wsd-decay-big     "--wsd-decay-frac"   -- train $D --lr-schedule wsd --wsd-decay-frac 1.5
check weight-decay-neg  "--weight-decay"     -- train $D --weight-decay -0.1
check eval-every-neg    "--eval-every"       -- train $D --eval-every -1
check sample-tokens-neg "--sample-tokens"    -- train $D --sample-tokens -5
check keep-last-no-dir  "--keep-last 2 needs --ckpt-dir" -- train $D --keep-last 2
check eval-every-no-val "--eval-every 5 needs --val-data" -- train $D --eval-every 5
check accum-and-tokens  "--grad-accum 2 with --batch-tokens" -- train $D --grad-accum 2 --batch-tokens 64
check stop-past-steps   "--stop-at-step 5 is beyond --steps 2" -- train $D --stop-at-step 5
check fail-limit-zero   "--ckpt-fail-limit"  -- train $D --ckpt-dir "$T/ckf" --ckpt-fail-limit 0
check micro-batch-word  "expected a micro-batch in \[1, 1000000\] or auto" -- train $D --micro-batch lots
check micro-batch-zero  "expected a micro-batch in \[1, 1000000\] or auto" -- train $D --micro-batch 0
check group-size-zero   "expected a rank count in \[1, 1048576\] or auto" -- train $D --zero-stage 1 --shard-group-size 0
check plan-mb-zero      "--micro-batch"      -- plan --micro-batch 0
check plan-accum-zero   "--grad-accum"       -- plan --grad-accum 0
check plan-mem-neg      "--mem-gib"          -- plan --mem-gib -5
check prepare-missing   "$T/missing.txt"     -- prepare --input "$T/missing.txt" --output "$T/out"
check sample-missing    "$T/none.bin"        -- sample --model-file "$T/none.bin"
# checkpoints: a good one, then broken copies
mpirun -np 2 --oversubscribe "$BIN" train $D --ckpt-dir "$T/ck" --quiet >/dev/null 2>&1 || { echo "FAIL: could not make a checkpoint"; exit 1; }
good="$T/ck/step_00000002"
for c in noindex missing trunc flip iflip; do cp -r "$good" "$T/$c"; done
rm "$T/noindex/index.h5"
rm "$T/missing/rank_00001.h5"
truncate -s 3000 "$T/trunc/rank_00000.h5"
# flip one byte in the middle of the master dataset's data (after the HDF5 metadata)
size=$(stat -c %s "$T/flip/rank_00000.h5")
printf '\x5a' | dd of="$T/flip/rank_00000.h5" bs=1 seek=$((size - 100)) conv=notrunc status=none
# flip one byte inside the index's HDF5 content (after its 512-byte checksummed header)
b=$(od -An -tu1 -j1500 -N1 "$T/iflip/index.h5" | tr -d ' ')
printf "\\x$(printf %02x $((b ^ 0x20)))" | dd of="$T/iflip/index.h5" bs=1 seek=1500 conv=notrunc status=none
mkdir -p "$T/empty"
check resume-not-ckpt   "$T/empty"           -- train $D --resume "$T/empty"
check resume-no-index   "$T/noindex"         -- train $D --resume "$T/noindex"
check resume-missing    "rank_00001.h5"      -- train $D --resume "$T/missing"
check resume-truncated  "rank_00000.h5"      -- train $D --resume "$T/trunc"
check resume-other-model "n_layer"           -- train $D --resume "$good" --n-layer 3
check resume-latest-dir "--ckpt-dir"         -- train $D --resume latest
check resume-auto-dir   "--ckpt-dir"         -- train $D --resume auto
check resume-latest-none "$T/empty"          -- train $D --resume latest --ckpt-dir "$T/empty"
check resume-flipped    "rank_00000.h5"      -- train $D --resume "$T/flip"
check verify-flipped    "rank_00000.h5"      -- ckpt verify "$T/flip"
check resume-index-flip "index.h5: checksum mismatch" -- train $D --resume "$T/iflip"
check inspect-index-flip "index.h5: checksum mismatch" -- ckpt inspect "$T/iflip"
check save-model-dir    "/nonexistent/dir"   -- train $D --save-model /nonexistent/dir/m.bin
# --init with a shape flag that disagrees with the imported model: refused, naming both
"$BIN" train $D --save-model "$T/init.bin" --quiet >/dev/null 2>&1 || { echo "FAIL: could not save a model"; exit 1; }
check init-shape        "--n-layer 7 disagrees with --init $T/init.bin, whose model has" -- train $D --init "$T/init.bin" --n-layer 7
check init-preset       "--model d12 (n-layer) 12 disagrees with --init" -- train $D --init "$T/init.bin" --model d12
settle
report_checks
fails=$((fails + check_fails))
[ -s "$good/index.h5" ] && "$BIN" ckpt verify "$good" >/dev/null || { echo "FAIL: the good checkpoint was damaged"; fails=$((fails+1)); }
[ $fails -eq 0 ] && echo "all CLI error cases ok" || { echo "$fails case(s) failed"; exit 1; }
