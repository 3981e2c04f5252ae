#!/usr/bin/env bash
# One command for a machine with one NVIDIA GPU, under a global time budget (default 360 s, so
# that the call, the machine's start included, ends inside 7 minutes on one H200 and a second
# call (--sanitize) fits the same 15-minute try). Sections, in the order that tells the most first:
#   0. the machine (seconds): driver, GPU name and compute capability, memory, nvcc, CMake, the
#      host compilers, Python and its NCCL/cuDNN/torch wheels, glibc, MPI, compute-sanitizer;
#      a missing compiler or CMake ends the check here, with one line;
#   1. the build (BUILD, default build-gpu/, only this GPU's architecture): where CMake cannot find
#      our libraries it unpacks the .debs carried in .gpu-deps/ (scripts/gpu-deps.sh: the lent GPU
#      machine has nvcc and CMake but no network), else runs scripts/install-deps.sh; an optional
#      part that fails to build (--attention cudnn, the cuDNN frontend) is dropped with one line
#      and the build goes on without it;
#   2. the tests, each section within its own cap, the jobs of a section side by side:
#      layouts (the mma.sync / ldmatrix fragment tests), kernels (every kernel against its CPU
#      twin, gpu_tests in 4 shards), nccl (NCCL against MPI, the engine over NCCL), training
#      (whole training runs against the CPU: train_gpu_test, recompute_test, tests/e2e_gpu/);
#      a job passes on exit 0, is skipped on 77 (a script) or when every test of it skipped (a
#      GoogleTest binary), and fails otherwise: a skipped test never hides a failed one;
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
# Writes one report file (default gpu-report.txt, under $OUT where set; --report PATH) and exits
# non-zero if the build or any test fails (2: bad arguments, 3: the budget ran out before every
# section ran).
#
# --dry: the same sections, under the CUDA emulation (an existing build-emu/ configured with
# -DSHARDGPT_CUDA_EMULATION=ON -DSHARDGPT_BENCH=ON; no build step) with tiny shapes and a few
# quick tests per section: checks the script, the sections' order, the budget arithmetic and the
# report's format (ctest gpu_check_dry); no figure of it is a GPU figure.
# --sanitize: instead of the tests and benchmarks, the kernel tests under compute-sanitizer
# (memcheck, racecheck, initcheck): a second call once the first's report is in.
# --plan: prints the sections with their caps and the budget they add up to, and runs nothing.
#   scripts/gpu-check.sh [--dry] [--plan] [--skip-build] [--sanitize] [--build DIR] [--report PATH] [--steps N] [--budget SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=
REPORT=${OUT:+$OUT/}gpu-report.txt
STEPS=8
SKIP_BUILD=0
SANITIZE=0
DRY=0
PLAN=0
BUDGET=360 BUDGET_SET=0
GPU_DEPS=.gpu-deps
while [ $# -gt 0 ]; do
  case $1 in
    --dry) DRY=1 ;;
    --plan) PLAN=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --sanitize) SANITIZE=1 ;;
    --build) BUILD=${2:?--build needs a directory}; shift ;;
    --report) REPORT=${2:?--report needs a path}; shift ;;
    --steps) STEPS=${2:?--steps needs a number}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds} BUDGET_SET=1; shift ;;
    *) echo "gpu-check: unknown argument $1 (expected --dry, --plan, --skip-build, --sanitize, --build DIR, --report PATH, --steps N, --budget S)" >&2; exit 2 ;;
  esac
  shift
done
[[ $STEPS =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 3 ] || { echo "gpu-check: --steps must be an integer >= 3 (2 are warm-up), not '$STEPS'" >&2; exit 2; }
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu-check: --budget must be whole seconds, not '$BUDGET'" >&2; exit 2; }
[ -n "$BUILD" ] || { [ $DRY -eq 1 ] && BUILD=build-emu || BUILD=build-gpu; }
[ $DRY -eq 1 ] && SKIP_BUILD=1

# The caps (seconds) of the sections, in the order they run. Each section also stops at the
# global deadline (--budget); what the budget cannot hold is reported as skipped (exit 3).
CAP_BUILD=200 CAP_LAYOUTS=30 CAP_KERNELS=60 CAP_NCCL=40 CAP_TRAINING=75 CAP_BENCH=25 CAP_ATTENTION=40
# --dry checks the sections, not their speed: the emulation on a loaded CI machine gets 4x the
# caps and (unless --budget is given) 4x the budget
if [ $DRY -eq 1 ]; then
  for s in BUILD LAYOUTS KERNELS NCCL TRAINING BENCH ATTENTION; do v=CAP_$s; printf -v "$v" '%d' $(( ${!v} * 4 )); done
  [ $BUDGET_SET -eq 1 ] || BUDGET=$(( BUDGET * 4 ))
fi
if [ $PLAN -eq 1 ]; then
  total=0
  for s in BUILD LAYOUTS KERNELS NCCL TRAINING; do v=CAP_$s; printf '%-10s %4d s\n' "${s,,}" "${!v}"; total=$((total + ${!v})); done
  printf '%-10s %4d s  (stages 0-3, --gelu fused, --profile, --roofline: 7 runs of at most %d s)\n' bench $((7 * CAP_BENCH)) $CAP_BENCH
  total=$((total + 7 * CAP_BENCH))
  printf '%-10s %4d s  (own and cudnn)\n' attention $((2 * CAP_ATTENTION)); total=$((total + 2 * CAP_ATTENTION))
  echo "caps add up to $total s; the budget is $BUDGET s (the deadline stops whatever is running then)"
  exit 0
fi
mkdir -p "$(dirname "$REPORT")" || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The lent machines run in sandboxes (gVisor, Firecracker) where OpenMPI's shared-memory
# single copy (CMA: process_vm_readv between ranks) may be refused mid-transfer ("Read -1,
# expected ..."), as in containers without ptrace rights: copy through the shared segment.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
START=$(date +%s)
DEADLINE=$(( START + BUDGET ))
exec > >(tee "$REPORT") 2>&1
TEE_PID=$! CLEAN=
# at exit: the temporary folder, and the report complete on disk before the script returns
on_exit() { [ -z "$CLEAN" ] || rm -rf "$CLEAN"; rm -f "$OUT_OF_TIME_MARK"; exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; }
trap on_exit EXIT
FAILED=0 SUMMARY=
# set (a file, as the jobs and $(...) run in subshells) once anything was not run for lack of time
OUT_OF_TIME_MARK=$(mktemp -u "${TMPDIR:-/tmp}/gpu-check-out-of-time.XXXXXX")
LOGS=$BUILD/gpu-check-logs

# limited SECONDS CMD...: runs CMD under timeout, at most SECONDS and never past the deadline;
# 200 (and nothing run) where less than 5 s of the budget is left.
ran_ok() { [ "$1" -eq 0 ] || [ "$1" -eq 200 ]; }  # passed, or not run for lack of time
limited() {
  local want=$1; shift
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 5 ]; then echo "gpu-check: out of time budget (--budget $BUDGET s): skipped: $*"; touch "$OUT_OF_TIME_MARK"; return 200; fi
  [ "$want" -lt "$left" ] || want=$left
  timeout --kill-after=5 "$want" "$@"
  local rc=$?
  [ $rc -eq 124 ] && echo "gpu-check: timed out after $want s: $*"
  return $rc
}

echo "== shardgpt gpu-check $(date -u +%FT%TZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(n=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l); [ "$n" -eq 0 ] || echo " with $n tracked files changed")$([ $DRY -eq 1 ] && echo ', DRY RUN under the CUDA emulation: no figure here is a GPU figure')"
# -- 0. the machine, before anything is spent on it
echo "== machine"
have() { command -v "$1" >/dev/null 2>&1; }
if have nvidia-smi; then
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,pci.bus_id --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "gpus: $(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
else
  echo "gpu: no nvidia-smi$([ $DRY -eq 1 ] && echo ' (dry run: the emulation)')"
fi
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
echo "nvcc: $([ -x "$NVCC" ] && "$NVCC" --version | tail -2 | head -1 || echo none)"
echo "cmake: $(have cmake && cmake --version | head -1 || echo none)"
echo "c++: $(have c++ && c++ --version | head -1 || echo none); gcc: $(have gcc && gcc -dumpfullversion || echo none)"
echo "glibc: $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}'); os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"); cores: $(nproc); memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
echo "mpi: $(have mpirun && mpirun --version 2>/dev/null | head -1 || echo "none on PATH (the carried .debs have Open MPI)")"
echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"
echo "python: $(python3 - <<'PY' 2>&1
import sys
from importlib import metadata
have = []
for name in ("torch", "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-frontend"):
    try:
        have.append("%s %s" % (name, metadata.version(name)))
    except Exception:
        pass
print("%s; %s" % (sys.version.split()[0], ", ".join(have) or "no torch/NCCL/cuDNN wheels"))
PY
)"
echo "carried: $([ -d "$GPU_DEPS" ] && echo "$(ls "$GPU_DEPS"/*.deb 2>/dev/null | wc -l) .debs in $GPU_DEPS$([ -f "$GPU_DEPS/cudnn-frontend-include.tar.gz" ] && echo ', the cuDNN frontend headers')" || echo "no $GPU_DEPS")"
if [ $SKIP_BUILD -eq 0 ]; then
  missing_tools=
  [ -x "$NVCC" ] || missing_tools+=" nvcc (the CUDA toolkit)"
  have cmake || missing_tools+=" cmake"
  have c++ || missing_tools+=" c++ (the host compiler)"
  [ -z "$missing_tools" ] || { echo "gpu-check: this machine lacks:$missing_tools; nothing built"; exit 1; }
fi
echo "== machine: $(( $(date +%s) - START )) s"

# the libraries carried in $GPU_DEPS (scripts/gpu-deps.sh), unpacked once per machine
use_carried_deps() {
  # shellcheck source=scripts/gpu-deps.sh
  source scripts/gpu-deps.sh && gpu_deps_use "$GPU_DEPS" "${TMPDIR:-/tmp}/shardgpt-gpu-deps"
}
# -- 1. the build
TARGETS="shardgpt gpu_tests train_gpu_test nccl_gpu_test recompute_test bench_train bench_comm"
if [ $SKIP_BUILD -eq 0 ]; then
  echo "== build"
  t0=$(date +%s)
  # only this GPU's architecture (half the nvcc time of the default sm_80 + sm_90)
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  GPU_DEPS_CMAKE_ARGS= CUDNN_ARG=
  configure() { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" -DSHARDGPT_BENCH=ON \
    ${ARCH:+-DCMAKE_CUDA_ARCHITECTURES=$ARCH} $GPU_DEPS_CMAKE_ARGS $CUDNN_ARG >"$BUILD/configure.log" 2>&1; }
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
  build() { limited "$CAP_BUILD" cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS >"$BUILD/build.log" 2>&1; }
  if ! build; then
    if grep -q "attention_cudnn" "$BUILD/build.log" && grep -q "SHARDGPT_HAVE_CUDNN_FRONTEND\|attention cudnn: built" "$BUILD/configure.log"; then
      # the optional part: the rest is built without it, and the report says why
      echo "gpu-check: --attention cudnn dropped: model/cuda/attention_cudnn.cc does not build against this cuDNN frontend: $(grep -m1 -E 'error' "$BUILD/build.log")"
      SUMMARY+="attention cudnn: dropped (does not build here; $BUILD/build.log)"$'\n'
      CUDNN_ARG=-DSHARDGPT_CUDNN=OFF
      configure && build
    else
      false
    fi || { grep -E "error" "$BUILD/build.log" | head -30; echo "gpu-check: build failed (log $BUILD/build.log)"; exit 1; }
  fi
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
  echo "== summary ($(( $(date +%s) - START )) s of the $BUDGET s budget)"
  printf '%s' "$SUMMARY"
  echo "== report: $REPORT"
  [ $FAILED -eq 0 ] || exit 1
  [ ! -e "$OUT_OF_TIME_MARK" ] || exit 3
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
  KERNELS='GpuTest.*:TcAttentionTest.*:Fragments/*:Precision/*:Act/GpuLlama.*'
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
      ran_ok $rc || FAILED=1
    done
  fi
  finish
fi

# -- 2. the tests. A section's jobs run side by side, each under the section's cap; every job
# writes its own log under $LOGS, and the report gets one line per job and a line per section.
mkdir -p "$LOGS"
SECTION= SECTION_CAP= SECTION_T0= SECTION_JOBS=() SECTION_PIDS=()
section() { SECTION=$1 SECTION_CAP=$2 SECTION_T0=$(date +%s) SECTION_JOBS=() SECTION_PIDS=(); echo "== tests: $SECTION (cap $SECTION_CAP s)"; }
# job NAME CMD...: starts CMD in the background, its output in $LOGS/SECTION-NAME.log
job() {
  local name=$1; shift
  local log=$LOGS/$SECTION-$name.log
  ( limited "$SECTION_CAP" "$@" >"$log" 2>&1; echo $? >"$log.rc" ) &
  SECTION_PIDS+=($!) SECTION_JOBS+=("$name")
}
# the verdict of one job from its exit status and its log: passed, skipped (77 from a script, or
# a GoogleTest run whose every test skipped and none failed) or failed
verdict() {
  local log=$1 rc=$2 ran skipped failed
  ran=$(grep -c '^\[       OK \]\|^\[  FAILED  \] [A-Za-z].*([0-9]* ms)$\|^\[  SKIPPED \] [A-Za-z].*([0-9]* ms)$' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*([0-9]* ms)$' "$log")
  failed=$(grep '^\[  FAILED  \] [A-Za-z].*([0-9]* ms)$' "$log" | sed 's/^\[  FAILED  \] //; s/ ([0-9]* ms)$//' | sort -u | tr '\n' ' ')
  if grep -q '^gpu-check: out of time budget' "$log"; then echo "not run (out of the time budget)"
  elif [ "$rc" -eq 0 ] && [ "$ran" -gt 0 ] && [ "$skipped" -eq "$ran" ]; then echo "skipped (all $ran tests: $(grep -m1 -A1 '^\[ RUN' "$log" | grep -o 'Skipped.*\|no .*' | head -1))"
  elif [ "$rc" -eq 0 ]; then echo "passed${ran:+ ($((ran - skipped)) tests$([ "$skipped" -gt 0 ] && echo ", $skipped skipped"))}" | sed 's/ (0 tests)//'
  elif [ "$rc" -eq 77 ]; then echo "skipped ($(grep -m1 '^SKIP' "$log" || echo 'exit 77'))"
  elif [ "$rc" -eq 124 ]; then echo "FAILED (timed out)"
  else echo "FAILED (rc $rc${failed:+: $failed})"; fi
}
section_end() {
  wait "${SECTION_PIDS[@]}"  # these jobs only: a bare wait would wait for the report's tee too
  local name log rc v passed=0 failed=0 skipped=0
  for name in "${SECTION_JOBS[@]}"; do
    log=$LOGS/$SECTION-$name.log
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    v=$(verdict "$log" "$rc")
    echo "  $name: $v (log $log)"
    case $v in
      passed*) passed=$((passed + 1)) ;;
      skipped*) skipped=$((skipped + 1)) ;;
      "not run"*) skipped=$((skipped + 1)) ;;
      *) failed=$((failed + 1)); FAILED=1; grep -E '^\[  FAILED  \]|Failure|FAIL|error' "$log" | head -12 | sed 's/^/    /' ;;
    esac
  done
  local line="$SECTION: $passed passed, $failed failed, $skipped skipped, $(( $(date +%s) - SECTION_T0 )) s"
  echo "== tests: $line"
  SUMMARY+="tests $line"$'\n'
}
GT=$BUILD/tests/gpu_tests
MPI_ENV="env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE"
KERNEL_ENV="env OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE"
E2E=tests/e2e_gpu
if [ $DRY -eq 1 ]; then
  # a few quick tests per section: the sections, their order and the report, not the coverage
  section layouts $CAP_LAYOUTS
  job fragments "$GT" --gtest_filter='Fragments/MmaTest.LayoutPutsEveryElementInItsPlace/Registers'
  section_end
  section kernels $CAP_KERNELS
  for i in 0 1; do
    job shard$i $KERNEL_ENV GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$GT" --gtest_filter='GpuTest.DeviceBasics:GpuTest.Layernorm:GpuTest.SumSquares:GpuTest.DeviceScalars'
  done
  job no_visible_gpu env CUDA_VISIBLE_DEVICES= "$GT" --gtest_filter='CudaNoGpu.*'
  section_end
  section nccl $CAP_NCCL
  job overlap_np2 $MPI_ENV mpirun -np 2 "$BUILD/tests/overlap_emu_test"
  section_end
  section training $CAP_TRAINING
  job train_oom_np1 $MPI_ENV mpirun -np 1 "$BUILD/tests/train_gpu_test" --gtest_filter='GpuTrain.OutOfMemoryNamesTheBuffer'
  section_end
else
  section layouts $CAP_LAYOUTS
  job fragments "$GT" --gtest_filter='Fragments/*'
  job device "$GT" --gtest_filter='GpuTest.DeviceBasics'
  section_end
  section kernels $CAP_KERNELS
  for i in 0 1 2 3; do
    job shard$i $KERNEL_ENV GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i "$GT" --gtest_filter='-Fragments/*:CudaNoGpu.*:GpuTest.DeviceBasics'
  done
  job no_visible_gpu env CUDA_VISIBLE_DEVICES= "$GT" --gtest_filter='CudaNoGpu.*'
  section_end
  section nccl $CAP_NCCL
  job nccl_np1 $MPI_ENV mpirun -np 1 "$BUILD/tests/nccl_gpu_test"
  job nccl_np2 $MPI_ENV mpirun -np 2 "$BUILD/tests/nccl_gpu_test"
  section_end
  section training $CAP_TRAINING
  job train_np1 $MPI_ENV mpirun -np 1 "$BUILD/tests/train_gpu_test"
  job train_np2 $MPI_ENV mpirun -np 2 "$BUILD/tests/train_gpu_test"
  job recompute_np2 $MPI_ENV SHARDGPT_RECOMPUTE_CUDA=1 mpirun -np 2 -x SHARDGPT_RECOMPUTE_CUDA "$BUILD/tests/mpi/recompute_test" --gtest_filter='RecomputeCuda.*'
  for s in "$E2E"/*.sh; do job "e2e_$(basename "$s" .sh)" $MPI_ENV bash "$s" "$SHARDGPT" "$PWD"; done
  section_end
fi
TESTS_RC=$FAILED
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
  line=$(limited $CAP_BENCH "$BENCH" --device cuda $SHAPE $PEAKS --dtype bf16 --zero-stage $stage --steps "$STEPS" 2>&1)
  rc=$?
  echo "$line"
  ran_ok $rc || { echo "gpu-check: stage $stage benchmark failed (rc $rc)"; FAILED=1; }
  tps=$(grep -o '[0-9.]* tokens/s' <<<"$line" | head -1)
  tf=$(grep -o '| [0-9.]* TFLOP/s' <<<"$line" | head -1 | sed 's/^| //')
  mfu=$(grep -o 'MFU [0-9.]*%' <<<"$line" | head -1)
  mem=$(grep -o 'peak memory [0-9.]* GiB tracked (plan predicts [0-9.]* GiB)' <<<"$line" | head -1)
  SUMMARY+="stage $stage: ${tps:-?} | ${tf:-?} | ${mfu:-MFU ?} | ${mem:-peak memory ?}"$'\n'
done

# The GELU in the fc matmul's cuBLASLt epilogue (--gelu fused) against stage 0 above (separate):
# the same shape and steps; the line after says how many calls really had the epilogue.
echo "== gelu fused: stage 0 with --gelu fused (GELU_AUX_BIAS forward, DGELU backward), beside stage 0 above"
line=$(limited $CAP_BENCH "$BENCH" --device cuda $SHAPE $PEAKS --dtype bf16 --zero-stage 0 --steps "$STEPS" --gelu fused 2>&1)
rc=$?
echo "$line"
ran_ok $rc || { echo "gpu-check: the --gelu fused benchmark failed (rc $rc)"; FAILED=1; }
tps=$(grep -o '[0-9.]* tokens/s' <<<"$line" | head -1)
mfu=$(grep -o 'MFU [0-9.]*%' <<<"$line" | head -1)
epi=$(grep -o '[0-9]* of [0-9]* calls ran the GELU' <<<"$line" | head -1)
SUMMARY+="stage 0 --gelu fused: ${tps:-?} | ${mfu:-MFU ?} | ${epi:-epilogue calls ?} in cuBLASLt's epilogue"$'\n'

echo "== per-kernel time from CUDA events on the compute stream, stage 0 (bench_train --profile 1)"
limited $CAP_BENCH "$BENCH" --device cuda $SHAPE $PEAKS --dtype bf16 --zero-stage 0 --steps "$STEPS" --profile 1
ran_ok $? || { echo "gpu-check: the profiled run failed"; FAILED=1; }
echo "== the roofline's prediction for the same shape (bench_train --roofline 1: nothing run)"
limited $CAP_BENCH "$BENCH" --roofline 1 $SHAPE --dtype bf16 $PEAKS
ran_ok $? || { echo "gpu-check: --roofline failed"; FAILED=1; }

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
  limited 60 "$SHARDGPT" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
  ran_ok $? || { echo "gpu-check: prepare failed"; FAILED=1; }
  for a in own cudnn; do
    limited $CAP_ATTENTION "$SHARDGPT" train --data "$T/data/train.bin" $TRAIN_SHAPE --dtype bf16 --device cuda \
      --steps "$STEPS" --seed 3 --quiet --attention $a --log "$T/$a.jsonl" >"$T/$a.out" 2>&1
    rc=$?
    if ran_ok $rc; then [ $rc -eq 0 ] || cat "$T/$a.out"
    elif [ $a = cudnn ] && grep -q "this build has no cuDNN frontend" "$T/$a.out"; then
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
    if not rows:
        continue  # not run, or refused: said above
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
