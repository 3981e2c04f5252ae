#!/usr/bin/env bash
# One command for a machine with one NVIDIA GPU, under a global time budget
# (default 450 s, so it ends inside 8 minutes on one H200):
#   1. builds the nvcc build with the benchmarks (BUILD, default build-gpu/); where CMake cannot
#      find our libraries it unpacks the .debs carried in .gpu-deps/ (scripts/gpu-deps.sh: the
#      lent GPU machine has nvcc and CMake but no network), else runs scripts/install-deps.sh;
#   2. runs the `gpu` tests (ctest -L gpu);
#   3. benchmarks GPT-2 124M (d12, T=1024, B=16, bf16) at ZeRO stages 0-3 on the one GPU:
#      tokens/s, model TFLOP/s, MFU against the GPU's dense bf16 peak (H100/H200 SXM: 989),
#      peak memory (the tracked allocations and the device's use) against `plan`'s prediction.
#      On one rank the stages shard over a world of 1: every rank's shard is the whole model and
#      each collective is a copy on the GPU, so stages 1-3 measure their code paths' own cost
#      (stage 3: gathering (copying) and freeing every unit, fp32 compute copies), not
#      communication or its overlap; then stage 0 again with --gelu fused (the GELU in
#      cuBLASLt's matmul epilogues) beside it, and how many of its calls had the epilogue;
#   4. a per-kernel time table from CUDA events on the compute stream (bench_train --profile 1)
#      with each kernel's FLOPs, bytes and achieved TFLOP/s or GB/s against the peaks, beside
#      the roofline's prediction for the same shape (bench_train --roofline 1);
#   5. --attention own vs --attention cudnn through `shardgpt train` (if its --help lists the
#      flag; else "not available"): tokens/s of each and their losses side by side.
# Writes one report file (default gpu-report.txt; --report PATH) and exits non-zero if the
# build or any test fails (2: bad arguments, 3: the budget ran out before every section ran).
#
# --dry: the same sections, under the CUDA emulation (an existing build-emu/ configured with
# -DSHARDGPT_CUDA_EMULATION=ON -DSHARDGPT_BENCH=ON; no build step) with tiny shapes and one
# quick gpu-emu test: checks the script and the report's format (ctest gpu_check_dry), no
# figure of it is a GPU figure.
# --sanitize: instead of the tests and benchmarks, the kernel tests under compute-sanitizer
# (memcheck, racecheck, initcheck): a second call once the first's report is in.
#   scripts/gpu-check.sh [--dry] [--skip-build] [--sanitize] [--build DIR] [--report PATH] [--steps N] [--budget SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=
REPORT=${OUT:+$OUT/}gpu-report.txt
STEPS=8
SKIP_BUILD=0
SANITIZE=0
DRY=0
BUDGET=450
GPU_DEPS=.gpu-deps
while [ $# -gt 0 ]; do
  case $1 in
    --dry) DRY=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --sanitize) SANITIZE=1 ;;
    --build) BUILD=${2:?--build needs a directory}; shift ;;
    --report) REPORT=${2:?--report needs a path}; shift ;;
    --steps) STEPS=${2:?--steps needs a number}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    *) echo "gpu-check: unknown argument $1 (expected --dry, --skip-build, --sanitize, --build DIR, --report PATH, --steps N, --budget S)" >&2; exit 2 ;;
  esac
  shift
done
[[ $STEPS =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 3 ] || { echo "gpu-check: --steps must be an integer >= 3 (2 are warm-up), not '$STEPS'" >&2; exit 2; }
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu-check: --budget must be whole seconds, not '$BUDGET'" >&2; exit 2; }
[ -n "$BUILD" ] || { [ $DRY -eq 1 ] && BUILD=build-emu || BUILD=build-gpu; }
[ $DRY -eq 1 ] && SKIP_BUILD=1
mkdir -p "$(dirname "$REPORT")" || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The lent machines run in sandboxes (gVisor, Firecracker) where OpenMPI's shared-memory
# single copy (CMA: process_vm_readv between ranks) may be refused mid-transfer ("Read -1,
# expected ..."), as in containers without ptrace rights: copy through the shared segment.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
DEADLINE=$(( $(date +%s) + BUDGET ))
exec > >(tee "$REPORT") 2>&1
TEE_PID=$! CLEAN=
# at exit: the temporary folder, and the report complete on disk before the script returns
on_exit() { [ -z "$CLEAN" ] || rm -rf "$CLEAN"; exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; }
trap on_exit EXIT
FAILED=0 OUT_OF_TIME=0 SUMMARY=

# limited SECONDS CMD...: runs CMD under timeout, at most SECONDS and never past the deadline.
limited() {
  local want=$1; shift
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 5 ]; then echo "gpu-check: out of time budget (--budget $BUDGET s): skipped: $*"; OUT_OF_TIME=1; return 124; fi
  [ "$want" -lt "$left" ] || want=$left
  timeout --kill-after=5 "$want" "$@"
  local rc=$?
  [ $rc -eq 124 ] && echo "gpu-check: timed out after $want s: $*"
  return $rc
}

echo "== shardgpt gpu-check $(date -u +%FT%TZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$([ $DRY -eq 1 ] && echo ', DRY RUN under the CUDA emulation: no figure here is a GPU figure')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,pci.bus_id,memory.total,driver_version --format=csv
# the libraries carried in $GPU_DEPS (scripts/gpu-deps.sh), unpacked once per machine
use_carried_deps() {
  # shellcheck source=scripts/gpu-deps.sh
  source scripts/gpu-deps.sh && gpu_deps_use "$GPU_DEPS" "${TMPDIR:-/tmp}/shardgpt-gpu-deps"
}
if [ $SKIP_BUILD -eq 0 ]; then
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$NVCC" ] || { echo "gpu-check: no nvcc (CUDA toolkit) found"; exit 1; }
  t0=$(date +%s)
  # only this GPU's architecture (half the nvcc time of the default sm_80 + sm_90)
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  GPU_DEPS_CMAKE_ARGS=
  configure() { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" -DSHARDGPT_BENCH=ON \
    ${ARCH:+-DCMAKE_CUDA_ARCHITECTURES=$ARCH} $GPU_DEPS_CMAKE_ARGS >"$BUILD/configure.log" 2>&1; }
  mkdir -p "$BUILD"
  if ! configure; then
    # Missing libraries. The lent GPU machine has nvcc and CMake but none of our Debian packages
    # and no network: the .debs carried with the call (scripts/gpu-deps.sh pack, `run`'s carry
    # [".gpu-deps"]) are unpacked under a prefix. Elsewhere: install them (Debian's apt).
    if [ -d "$GPU_DEPS" ]; then
      echo "gpu-check: configure failed (see $BUILD/configure.log); using the carried libraries in $GPU_DEPS"
      use_carried_deps || exit 1
      rm -f "$BUILD/CMakeCache.txt"
    else
      echo "gpu-check: configure failed (see $BUILD/configure.log); running scripts/install-deps.sh"
      scripts/install-deps.sh >/dev/null
    fi
    configure || { tail -20 "$BUILD/configure.log"; echo "gpu-check: configure failed"; exit 1; }
  fi
  grep -E "shardgpt: (CUDA backend|NCCL communicator|--attention cudnn)" "$BUILD/configure.log"
  limited 240 cmake --build "$BUILD" -j "$(nproc)" --target shardgpt gpu_tests train_gpu_test nccl_gpu_test bench_train bench_comm \
    >"$BUILD/build.log" 2>&1 || { grep -E "error" "$BUILD/build.log" | head -30; echo "gpu-check: build failed (log $BUILD/build.log)"; exit 1; }
  echo "== build: $(( $(date +%s) - t0 )) s"
fi
# a library the programs need and this machine cannot load: one line naming it, before any test
unloadable() { ldd "$BUILD/shardgpt" 2>/dev/null | awk '/not found/ {print $1}' | sort -u | tr '\n' ' '; }
missing=$(unloadable)
if [ -n "$missing" ] && [ -d "$GPU_DEPS" ]; then  # --skip-build after a build on the carried libraries
  use_carried_deps >/dev/null || exit 1
  missing=$(unloadable)
fi
[ -z "$missing" ] || { echo "gpu-check: $BUILD/shardgpt needs libraries this machine cannot load: $missing"; exit 1; }
# the summary, the report's path, and the exit status: 1 if anything failed, 3 if the budget ran out
finish() {
  echo "== summary"
  printf '%s' "$SUMMARY"
  echo "== report: $REPORT"
  [ $FAILED -eq 0 ] || exit 1
  [ $OUT_OF_TIME -eq 0 ] || exit 3
  exit 0
}
BENCH=$BUILD/bench/bench_train SHARDGPT=$BUILD/shardgpt
for f in "$BENCH" "$SHARDGPT"; do [ -x "$f" ] || { echo "gpu-check: $f is not built (configure $BUILD with -DSHARDGPT_BENCH=ON)"; exit 1; }; done

if [ $SANITIZE -eq 1 ]; then
  # Instead of the tests and the benchmarks: the kernel tests under compute-sanitizer, whose
  # reports name the kernel, the thread and the address (memcheck: out-of-bounds and misaligned
  # accesses; racecheck: shared-memory hazards of the tiled kernels; initcheck: reads of device
  # memory nothing wrote). Small shapes; each tool at most 90 s, so the three fit a second
  # call of about 5 minutes (--budget 280).
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  KERNELS='GpuTest.*:TcAttentionTest.*:Fragments/*:Precision/*'
  if [ $DRY -eq 1 ] || [ ! -x "$SAN" ]; then
    echo "== compute-sanitizer: not run ($([ $DRY -eq 1 ] && echo 'the emulation runs no GPU code' || echo "no $SAN"))"
    [ $DRY -eq 1 ] || FAILED=1
  else
    for tool in memcheck racecheck initcheck; do
      filter=$KERNELS
      [ $tool = racecheck ] && filter='TcAttentionTest.*:GpuTest.Attention:GpuTest.Layernorm:GpuTest.ResidualLayernormFused:GpuTest.CrossEntropy*:GpuTest.SumSquares'
      echo "== compute-sanitizer --tool $tool: gpu_tests --gtest_filter=$filter"
      t0=$(date +%s)
      limited 90 "$SAN" --tool $tool --error-exitcode 99 --print-limit 20 "$BUILD/tests/gpu_tests" --gtest_filter="$filter" \
        >"$BUILD/sanitize-$tool.log" 2>&1
      rc=$?
      grep -E "^=========|\[  (PASSED|FAILED)|tests ran" "$BUILD/sanitize-$tool.log" | head -60
      echo "== compute-sanitizer --tool $tool: rc=$rc, $(( $(date +%s) - t0 )) s (log $BUILD/sanitize-$tool.log)"
      SUMMARY+="compute-sanitizer $tool: rc=$rc"$'\n'
      [ $rc -eq 0 ] || FAILED=1
    done
  fi
  finish
fi

echo "== gpu tests"
t0=$(date +%s)
if [ $DRY -eq 1 ]; then
  limited 120 ctest --test-dir "$BUILD" -L gpu-emu -R '^(overlap_emu_test_np2|gpu_tests_without_visible_gpu)$' --output-on-failure
  TESTS_RC=$?
else
  limited 180 ctest --test-dir "$BUILD" -L gpu --output-on-failure; TESTS_RC=$?
fi
[ $TESTS_RC -eq 0 ] || FAILED=1
echo "== gpu tests: rc=$TESTS_RC, $(( $(date +%s) - t0 )) s"

# The shape: d12 at T=1024 B=16 on a GPU; a tiny one in the dry run (the emulation is slow).
if [ $DRY -eq 1 ]; then
  SHAPE="--config d12 --layers 2 --heads 2 --embd 32 --vocab 64 --seq-len 16 --micro-batch 2"
  TRAIN_SHAPE="--n-layer 2 --n-head 2 --n-embd 32 --vocab-size 256 --seq-len 16 --micro-batch 2"
  PEAKS="--peak-tflops 989 --peak-gbs 4800"  # the emulation has no peak; columns exercised
else
  SHAPE="--config d12"
  TRAIN_SHAPE="--model d12 --seq-len 1024 --micro-batch 16"
  PEAKS=
fi
echo "== benchmark: $SHAPE (d12: GPT-2 124M, T=1024, B=16), bf16, one rank on one GPU, $STEPS steps (median after 2 warm-up)"
echo "   (stages 1-3 on one rank: a world of 1, every shard the whole model, collectives are copies on the GPU)"
for stage in 0 1 2 3; do
  line=$(limited 90 "$BENCH" --device cuda $SHAPE $PEAKS --dtype bf16 --zero-stage $stage --steps "$STEPS" 2>&1)
  rc=$?
  echo "$line"
  [ $rc -eq 0 ] || { echo "gpu-check: stage $stage benchmark failed (rc $rc)"; FAILED=1; }
  tps=$(grep -o '[0-9.]* tokens/s' <<<"$line" | head -1)
  tf=$(grep -o '| [0-9.]* TFLOP/s' <<<"$line" | head -1 | sed 's/^| //')
  mfu=$(grep -o 'MFU [0-9.]*%' <<<"$line" | head -1)
  mem=$(grep -o 'peak memory [0-9.]* GiB tracked (plan predicts [0-9.]* GiB)' <<<"$line" | head -1)
  SUMMARY+="stage $stage: ${tps:-?} | ${tf:-?} | ${mfu:-MFU ?} | ${mem:-peak memory ?}"$'\n'
done

# The GELU in the fc matmul's cuBLASLt epilogue (--gelu fused) against stage 0 above (separate):
# the same shape and steps; the line after says how many calls really had the epilogue.
echo "== gelu fused: stage 0 with --gelu fused (GELU_AUX_BIAS forward, DGELU backward), beside stage 0 above"
line=$(limited 90 "$BENCH" --device cuda $SHAPE $PEAKS --dtype bf16 --zero-stage 0 --steps "$STEPS" --gelu fused 2>&1)
rc=$?
echo "$line"
[ $rc -eq 0 ] || { echo "gpu-check: the --gelu fused benchmark failed (rc $rc)"; FAILED=1; }
tps=$(grep -o '[0-9.]* tokens/s' <<<"$line" | head -1)
mfu=$(grep -o 'MFU [0-9.]*%' <<<"$line" | head -1)
epi=$(grep -o '[0-9]* of [0-9]* calls ran the GELU' <<<"$line" | head -1)
SUMMARY+="stage 0 --gelu fused: ${tps:-?} | ${mfu:-MFU ?} | ${epi:-epilogue calls ?} in cuBLASLt's epilogue"$'\n'

echo "== per-kernel time from CUDA events on the compute stream, stage 0 (bench_train --profile 1)"
limited 90 "$BENCH" --device cuda $SHAPE $PEAKS --dtype bf16 --zero-stage 0 --steps "$STEPS" --profile 1 ||
  { echo "gpu-check: the profiled run failed"; FAILED=1; }
echo "== the roofline's prediction for the same shape (bench_train --roofline 1: nothing run)"
limited 60 "$BENCH" --roofline 1 $SHAPE --dtype bf16 $PEAKS || { echo "gpu-check: --roofline failed"; FAILED=1; }

echo "== attention: --attention own vs --attention cudnn (shardgpt train, bf16, stage 0, $STEPS steps)"
help=$("$SHARDGPT" train --help 2>&1)
if ! grep -q -- '--attention' <<<"$help"; then
  echo "attention own vs cudnn: not available (shardgpt train --help lists no --attention)"
  SUMMARY+="attention own vs cudnn: not available"$'\n'
else
  T=$(mktemp -d); CLEAN=$T
  python3 -c "
import random; random.seed(1)
w = 'In the beginning God created the heaven and the earth . And the earth was without form and void'.split()
print(' '.join(random.choice(w) for _ in range(400000)))" > "$T/text.txt"
  limited 60 "$SHARDGPT" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "gpu-check: prepare failed"; FAILED=1; }
  for a in own cudnn; do
    limited 120 "$SHARDGPT" train --data "$T/data/train.bin" $TRAIN_SHAPE --dtype bf16 --device cuda \
      --steps "$STEPS" --seed 3 --quiet --attention $a --log "$T/$a.jsonl" >"$T/$a.out" 2>&1 ||
      if [ $a = cudnn ] && grep -q "this build has no cuDNN frontend" "$T/$a.out"; then
        # optional: built only where CMake found the cuDNN frontend's headers (never under the
        # emulation); the report says so, it is not a failed check
        echo "attention cudnn: not available in this build: $(grep -m1 'no cuDNN frontend' "$T/$a.out")"
        SUMMARY+="attention cudnn: not available in this build"$'\n'
      else
        { tail -5 "$T/$a.out"; echo "gpu-check: shardgpt train --attention $a failed"; FAILED=1; }
      fi
  done
  cmp=$(python3 - "$T/own.jsonl" "$T/cudnn.jsonl" <<'PY'
import json, sys, statistics
runs = {}
for name, path in zip(("own", "cudnn"), sys.argv[1:]):
    try:
        runs[name] = [json.loads(l) for l in open(path)]
    except OSError:
        runs[name] = []
for name, rows in runs.items():
    later = [r["tokens_per_s"] for r in rows if r["step"] > 2]
    print("attention %-5s: %s tokens/s (median of steps > 2), losses %s" % (
        name, "%.0f" % statistics.median(later) if later else "?", " ".join("%.4f" % r["loss"] for r in rows)))
if runs["own"] and runs["cudnn"]:
    print("attention own vs cudnn: max |loss difference| %.3g over %d steps" % (
        max(abs(a["loss"] - b["loss"]) for a, b in zip(runs["own"], runs["cudnn"])), min(len(runs["own"]), len(runs["cudnn"]))))
PY
)
  echo "$cmp"
  SUMMARY+="$cmp"$'\n'
fi

GPUS=0
if [ $DRY -eq 0 ] && command -v nvidia-smi >/dev/null; then GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
if [ "$GPUS" -ge 2 ]; then  # more than the one GPU this script is sized for: NCCL scaling too
  echo "== multi-GPU: $GPUS GPUs, NCCL, d12 bf16 T=1024 B=16 per rank, stages 0-3 against $GPUS x one GPU"
  for stage in 0 1 2 3; do
    limited 120 mpirun -np "$GPUS" "$BENCH" --device cuda --comm nccl --config d12 --dtype bf16 --zero-stage $stage \
      --steps "$STEPS" || echo "gpu-check: $GPUS-GPU stage $stage benchmark failed"
  done
  [ -x "$BUILD/bench/bench_comm" ] && limited 60 mpirun -np "$GPUS" "$BUILD/bench/bench_comm" --device cuda --comm nccl 64 256
fi

SUMMARY+="tests: rc=$TESTS_RC"$'\n'
finish
