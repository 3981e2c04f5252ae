#!/usr/bin/env bash
# scripts/gpu-deps.sh on a machine like the lent GPU machine: a compiler, CMake and Python, none
# of our Debian packages, no network. Such a machine is made here: a Debian chroot (13 unless
# GPU_DEPS_SUITE says otherwise) by debootstrap (minbase + build-essential, cmake, python3),
# entered in new mount and network namespaces (only a loopback interface: nothing can be
# fetched inside). Outside, `pack` fetches
# the .debs; inside, gpu_deps_use unpacks them under /tmp and this source tree is configured
# against them (MPI, HDF5, OpenBLAS, oneDNN, CLI11, nlohmann-json, PCRE2, GoogleTest), shardgpt
# is built, trains on one rank writing an HDF5 checkpoint, and resumes it on 2 ranks under the
# relocated OpenMPI's mpirun. Where this machine has the CUDA toolkit, it is bound in read-only
# and the build is the nvcc one gpu-check.sh makes (sm_90; CUDA backend, NCCL, --attention
# cudnn configured and compiled; nothing of it can run without a GPU). Not covered: another
# distribution's image. NCCL/cuDNN from Python wheels: a fake site-packages, checked first.
# Usage: tests/deps/gpu_deps.sh [SOURCE_DIR]. Root only; needs apt's mirror to make the chroot
# (exit 77, skipped, when either is missing).
set -uo pipefail
SRC=$(realpath "${1:-$(dirname "$0")/../..}")
[ "$(id -u)" -eq 0 ] || { echo "SKIP: debootstrap and chroot need root"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1
command -v debootstrap >/dev/null || { echo "SKIP: no debootstrap (apt-get cannot install it)"; exit 77; }
command -v unshare >/dev/null && command -v ip >/dev/null || fail "needs unshare (util-linux) and ip (iproute2)"
# the chroot's release: GPU_DEPS_SUITE (default trixie, Debian 13: a newer system than the one
# the packages come from, as the GPU machine's image is likely to be: glibc 2.41, gcc 14)
SUITE=${GPU_DEPS_SUITE:-trixie}
ROOT=$(mktemp -d /var/tmp/shardgpt-gpu-deps.XXXXXX) || fail mktemp
trap 'rm -rf --one-file-system "$ROOT"' EXIT
t0=$SECONDS

# NCCL and cuDNN from Python wheels (the GPU image's way; the chroot below takes the toolkit's):
# a fake site-packages in the two layouts seen (nvidia/nccl/lib; nvidia/cu13/lib holding cuDNN's
# several libraries), a toolkit without either, and a python3 that names that site-packages.
W=$ROOT/wheels
mkdir -p "$W/bin" "$W/site/nvidia/nccl/lib" "$W/site/nvidia/nccl/include" "$W/site/nvidia/cu13/lib" \
  "$W/site/nvidia/cu13/include" "$W/cuda/lib64"
touch "$W/site/nvidia/nccl/lib/libnccl.so.2" "$W/site/nvidia/nccl/include/nccl.h" "$W/site/nvidia/cu13/lib/libcudnn.so.9" \
  "$W/site/nvidia/cu13/lib/libcudnn_ops.so.9" "$W/site/nvidia/cu13/include/cudnn.h"
printf '#!/bin/sh\necho %s\n' "$W/site" >"$W/bin/python3" && chmod +x "$W/bin/python3"
env -u NCCL_HOME -u CUDNN_HOME PATH="$W/bin:$PATH" GPU_DEPS_CUDA="$W/cuda" bash -c '
  source "$1/scripts/gpu-deps.sh"
  _gpu_deps_from_wheel NCCL libnccl .so.2 nccl.h "$2/nccl" >/dev/null && _gpu_deps_from_wheel CUDNN libcudnn .so.9 cudnn.h "$2/cudnn" >/dev/null
  [ "$NCCL_HOME" = "$2/nccl" ] && [ "$CUDNN_HOME" = "$2/cudnn" ] || exit 1
  for f in nccl/lib/libnccl.so nccl/lib/libnccl.so.2 nccl/include/nccl.h cudnn/lib/libcudnn.so cudnn/lib/libcudnn.so.9            cudnn/lib/libcudnn_ops.so.9 cudnn/include/cudnn.h; do [ -e "$2/$f" ] || { echo "missing $f"; exit 1; }; done
  case ":$LD_LIBRARY_PATH:" in *":$2/nccl/lib:"*) ;; *) exit 1 ;; esac
  case ":$LD_LIBRARY_PATH:" in *":$2/cudnn/lib:"*) ;; *) exit 1 ;; esac' _ "$SRC" "$W/out" ||
  fail "NCCL/cuDNN from a Python wheel's layout not linked as CMake and the loader need them"
# and a toolkit that has NCCL keeps it: nothing linked
env -u NCCL_HOME PATH="$W/bin:$PATH" GPU_DEPS_CUDA="$W/cuda" bash -c '
  touch "$3/lib64/libnccl.so.2"; source "$1/scripts/gpu-deps.sh"
  _gpu_deps_from_wheel NCCL libnccl .so.2 nccl.h "$2/kept"; [ -z "${NCCL_HOME:-}" ] && [ ! -e "$2/kept" ]' _ "$SRC" "$W/out" "$W/cuda" ||
  fail "a toolkit with NCCL: the wheel's was linked anyway"
echo "NCCL and cuDNN from Python wheels: linked (both layouts); a toolkit's NCCL kept"
# the mirror apt uses here
MIRROR=$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | awk '{print $2}' | head -1)
debootstrap --variant=minbase "$SUITE" "$ROOT/fs" "${MIRROR:-http://deb.debian.org/debian}" >"$ROOT/debootstrap.log" 2>&1 ||
  { tail -3 "$ROOT/debootstrap.log"; echo "SKIP: debootstrap could not make a Debian $SUITE chroot (mirror unreachable?)"; exit 77; }
cp /etc/resolv.conf "$ROOT/fs/etc/"
unshare -m chroot "$ROOT/fs" sh -c 'mount -t proc proc /proc && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends build-essential cmake python3 >/dev/null' \
  >"$ROOT/apt.log" 2>&1 || { tail -5 "$ROOT/apt.log"; fail "apt-get in the chroot"; }
echo "chroot with build-essential, cmake, python3: $((SECONDS - t0)) s"
# what the machine lacks: none of these may be in the chroot before the unpacking
for lib in libmpi.so.40 libhdf5_serial.so.103 libopenblas.so.0 libdnnl.so.2; do
  ! chroot "$ROOT/fs" ldconfig -p | grep -q "$lib" || fail "the chroot already has $lib"
done
"$SRC/scripts/gpu-deps.sh" pack "$ROOT/fs/root/src/.gpu-deps" || fail "scripts/gpu-deps.sh pack"
(cd "$SRC" && git ls-files -z | xargs -0 tar -cf - --) | tar -C "$ROOT/fs/root/src" -xf - || fail "copy of the source tree"

cat >"$ROOT/fs/root/inside.sh" <<'EOF'
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
cd /root/src
! getent hosts deb.debian.org >/dev/null || fail "the chroot can resolve names: not offline"
source scripts/gpu-deps.sh && gpu_deps_use .gpu-deps /tmp/deps || fail "gpu_deps_use"
# with the CUDA toolkit where this machine has one (bound in read-only, as the GPU machine's own):
# the nvcc build gpu-check.sh makes there, for one architecture
CUDA_ARGS=
[ -x /usr/local/cuda/bin/nvcc ] && CUDA_ARGS="-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90"
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DSHARDGPT_BENCH=OFF $CUDA_ARGS $GPU_DEPS_CMAKE_ARGS >/tmp/configure.log 2>&1 ||
  { tail -20 /tmp/configure.log; fail "configure against the unpacked libraries"; }
grep -q "Found HDF5: /tmp/deps/" /tmp/configure.log && grep -q "Found BLAS: /tmp/deps/" /tmp/configure.log ||
  { grep Found /tmp/configure.log; fail "HDF5 or BLAS not from /tmp/deps"; }
if [ -n "$CUDA_ARGS" ]; then
  grep -q "shardgpt: CUDA backend: built" /tmp/configure.log && grep -q "shardgpt: NCCL communicator: ON" /tmp/configure.log ||
    { grep "shardgpt:" /tmp/configure.log; fail "the CUDA backend or NCCL not configured"; }
  echo "inside: $(grep -E 'shardgpt: (CUDA backend|NCCL|--attention cudnn)' /tmp/configure.log | tr '\n' ';')"
fi
cmake --build /tmp/b -j "$(nproc)" --target shardgpt >/tmp/build.log 2>&1 || { grep -m5 error /tmp/build.log; fail "build"; }
missing=$(ldd /tmp/b/shardgpt | grep "not found")
[ -z "$missing" ] || fail "libraries not found: $missing"
for lib in libmpi.so.40 libhdf5_serial.so.103 libopenblas.so.0 libdnnl.so.2; do
  ldd /tmp/b/shardgpt | grep "$lib => /tmp/deps/" >/dev/null || fail "$lib not loaded from /tmp/deps"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for i in $(seq 1 300); do echo "In the beginning God created the heaven and the earth."; done > /tmp/t.txt
/tmp/b/shardgpt prepare --input /tmp/t.txt --output /tmp/d >/dev/null || fail prepare
A="--data /tmp/d/train.bin --seq-len 32 --n-layer 2 --n-embd 32 --n-head 2 --micro-batch 2 --batch-tokens 128 --quiet --ckpt-dir /tmp/ck --zero-stage 1"
/tmp/b/shardgpt train $A --steps 6 --stop-at-step 3 >/tmp/one.out 2>&1 || { cat /tmp/one.out; fail "1-rank run"; }
mpirun -np 2 --oversubscribe /tmp/b/shardgpt train $A --steps 6 --resume latest >/tmp/two.out 2>&1 || { tail -20 /tmp/two.out; fail "mpirun -np 2 resume"; }
grep -q "resumed from .*step_00000003 at step 3 .* on 2 rank(s)" /tmp/two.out && grep -q "final train loss" /tmp/two.out ||
  { tail -20 /tmp/two.out; fail "the 2-rank run did not resume the checkpoint and finish"; }
! grep -q "couldn't open the help file" /tmp/two.out || { grep -A3 "Sorry" /tmp/two.out; fail "OpenMPI or PMIx looked outside the prefix"; }
echo "inside: configured, built and ran against /tmp/deps: $(grep -c . /tmp/configure.log) configure lines; $(grep 'final train loss' /tmp/two.out)"
EOF
# new mount and network namespaces: the chroot's mounts vanish with them, and only a loopback
# interface exists inside (MPI's daemons talk over it)
CUDA_BIND=:
if [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=$(realpath /usr/local/cuda)
  mkdir -p "$ROOT/fs/usr/local/cuda" "$ROOT/fs$cuda"
  CUDA_BIND="mount --bind -o ro '$cuda' '$ROOT/fs/usr/local/cuda' && mount --bind -o ro '$cuda' '$ROOT/fs$cuda'"
fi
unshare -m -n sh -c "ip link set lo up && mount -t proc proc '$ROOT/fs/proc' && mount --rbind /dev '$ROOT/fs/dev' &&
  mount --rbind /sys '$ROOT/fs/sys' && $CUDA_BIND && rm -f '$ROOT/fs/etc/resolv.conf' && chroot '$ROOT/fs' bash /root/inside.sh" ||
  fail "inside the chroot (above)"
echo "gpu-deps ok in $((SECONDS - t0)) s: $(du -sh "$ROOT/fs/root/src/.gpu-deps" | cut -f1) of .debs"
