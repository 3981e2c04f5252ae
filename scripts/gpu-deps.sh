#!/usr/bin/env bash
# The libraries shardgpt builds against, for a machine that has a compiler, CMake and the CUDA
# toolkit but none of our Debian packages and no network: the lent GPU machine (an image with
# nvcc, CMake and PyTorch; apt-get cannot reach a mirror there). Two halves:
#
#   scripts/gpu-deps.sh pack [DIR]        HERE (Debian 12, apt-get works): downloads the .debs of
#       MPI, HDF5, OpenBLAS, oneDNN, CLI11, nlohmann-json, GoogleTest, Google Benchmark, PCRE2 and
#       their libraries into DIR (default .gpu-deps/, ignored by git; ~37 MB), and the cuDNN
#       frontend's headers (PyPI's nvidia-cudnn-frontend wheel) if pip can fetch them. Carry DIR
#       with the device call (`run`'s carry: [".gpu-deps"]).
#   source scripts/gpu-deps.sh; gpu_deps_use DIR PREFIX     THERE (gpu-check.sh does this when
#       CMake cannot find the libraries and DIR exists): unpacks every .deb into PREFIX (dpkg-deb,
#       or ar + tar), makes the links Debian's maintainer scripts would have made (mpirun, the
#       alternatives of libblas), and exports what CMake and the programs need: PATH,
#       LD_LIBRARY_PATH, CMAKE_PREFIX_PATH, PKG_CONFIG_PATH, HDF5_ROOT, OPAL_PREFIX (OpenMPI
#       relocated), GPU_DEPS_CMAKE_ARGS (flags for cmake); NCCL and cuDNN from the image's Python
#       wheels (nvidia-nccl-cu13, nvidia-cudnn-cu13) when the toolkit has none (NCCL_HOME,
#       CUDNN_HOME, CUDNN_FRONTEND_INCLUDE_DIR).
#
# Nothing is installed into the system: everything lives under PREFIX. Tested by
# tests/deps/gpu_deps.sh in an offline Debian chroot that has only build-essential, cmake and
# python3.

# The packages: what `apt-get install --no-install-recommends` pulls into such a chroot for our
# libraries, less what only a static link or another language would use (gfortran, autotools,
# ssh, the -dev packages of libraries we link only through others, HDF5's Fortran and its
# compiler wrappers, whose flags name libcurl/libcrypto development files).
GPU_DEPS_PACKAGES=(
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libhwloc-plugins
  libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 libfabric1
  libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2
  libpsm-infinipath1 libnuma1 libmunge2 libltdl7 libpciaccess0 libxnvctrl0 libx11-6 libx11-data
  libxcb1 libxau6 libxdmcp6 libxext6 libbsd0 libmd0
  libhdf5-dev libhdf5-103-1 libhdf5-cpp-103-1 libhdf5-hl-100 libhdf5-hl-cpp-100 libaec0 libsz2
  libcurl4 libnghttp2-14 librtmp1 libssh2-1 libpsl5 libbrotli1 libldap-2.5-0 libsasl2-2
  libsasl2-modules-db libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5
  libdnnl-dev libdnnl2 ocl-icd-libopencl1
  libcli11-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev libbenchmark1debian
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  zlib1g-dev zlib1g
  pkgconf pkgconf-bin libpkgconf3 pkg-config
)

# gpu_deps_cudnn_frontend DIR: the cuDNN frontend's headers (header-only C++) from PyPI's
# nvidia-cudnn-frontend wheel (downloaded, not installed) into DIR/include, the wheel's name into
# DIR/version. The frontend's headers include each other as ../include/NAME: the folder must be
# called include. Non-zero, with pip's message on stderr, where pip cannot fetch it.
gpu_deps_cudnn_frontend() {
  local dir=$1 wheel
  rm -rf "$dir" && mkdir -p "$dir/wheel" || return 1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir/wheel" nvidia-cudnn-frontend >&2 || { rm -rf "$dir"; return 1; }
  wheel=$(ls "$dir"/wheel/*.whl | head -1)
  python3 - "$wheel" "$dir/include" <<'PY' || { rm -rf "$dir"; return 1; }
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if not n.endswith("/")]
root = next(os.path.dirname(n) for n in names if os.path.basename(n) == "cudnn_frontend.h")
for n in names:
    if n.startswith(root + "/"):
        out = os.path.join(sys.argv[2], n[len(root) + 1:])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(z.read(n))
PY
  basename "$wheel" .whl >"$dir/version"
  rm -rf "$dir/wheel"
}

gpu_deps_pack() {
  local dir=${1:-.gpu-deps}
  mkdir -p "$dir" || return 1
  dir=$(realpath "$dir")
  command -v apt-get >/dev/null || { echo "gpu-deps: pack needs apt-get (Debian 12, the release CI uses)" >&2; return 1; }
  (cd "$dir" && rm -f ./*.deb && apt-get download "${GPU_DEPS_PACKAGES[@]}" >"$dir/download.log" 2>&1) ||
    { tail -5 "$dir/download.log"; echo "gpu-deps: apt-get download failed (see $dir/download.log)" >&2; return 1; }
  # the cuDNN frontend (header-only C++): --attention cudnn is built only where CMake finds it
  rm -rf "$dir/cudnn-frontend"
  if gpu_deps_cudnn_frontend "$dir/cudnn-frontend" 2>"$dir/pip.log"; then
    tar -C "$dir/cudnn-frontend/include" -czf "$dir/cudnn-frontend-include.tar.gz" . &&
      echo "gpu-deps: cuDNN frontend headers from $(cat "$dir/cudnn-frontend/version")"
  else
    echo "gpu-deps: no nvidia-cudnn-frontend wheel (pip: $(tail -1 "$dir/pip.log")): --attention cudnn will not be built there"
  fi
  rm -rf "$dir/cudnn-frontend"
  echo "gpu-deps: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir"
}

# A .deb's file list, and its files unpacked under a prefix: dpkg-deb, or (where the machine has
# no dpkg) ar + tar, a .deb being an ar archive holding data.tar.{xz,zst,gz}.
_gpu_deps_list() {
  if command -v dpkg-deb >/dev/null; then dpkg-deb --fsys-tarfile "$1" | tar -t
  else (t=$(mktemp -d) && cd "$t" && ar x "$1" && tar -tf data.tar.*; rc=$?; rm -rf "$t"; exit $rc); fi
}
_gpu_deps_unpack() {
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  local t; t=$(mktemp -d) || return 1
  (cd "$t" && ar x "$1") && tar -C "$2" -xf "$t"/data.tar.*; local rc=$?
  rm -rf "$t"; return $rc
}

# _gpu_deps_all_known LIBS HAVE: every file name in LIBS (libz.so.1.2.13) is known to the
# dynamic loader under itself or a shorter version of it (libz.so.1) in HAVE (ldconfig -p's names)
_gpu_deps_all_known() {
  local f n
  for f in $1; do
    n=$f
    while [[ $n == *.so.* ]] && ! grep -qxF -- "$n" <<<"$2"; do n=${n%.*}; done
    [[ $n == *.so.* ]] || return 1
  done
  return 0
}

# _gpu_deps_from_wheel NAME STEM SUFFIX HEADER DIR: where NAME_HOME is unset and the toolkit has
# no STEM library, the image's Python wheel's (its layout differs between releases: nvidia/nccl/lib,
# nvidia/cu13/lib, so searched): DIR/lib links every STEM*SUFFIX of the wheel's directory (cuDNN
# is several libraries) and STEM.so, the unversioned name CMake's find_library wants; DIR/include
# links the header's directory; NAME_HOME=DIR, DIR/lib on LD_LIBRARY_PATH.
_gpu_deps_from_wheel() {
  local name=$1 stem=$2 suffix=$3 header=$4 dir=$5 home platlib so inc f
  home=${name}_HOME
  [ -z "${!home:-}" ] || return 0
  local cuda=${GPU_DEPS_CUDA:-/usr/local/cuda}  # the toolkit (a test points it elsewhere)
  compgen -G "$cuda/lib64/$stem.so*" >/dev/null || compgen -G "$cuda/lib/$stem.so*" >/dev/null && return 0
  platlib=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['platlib'])" 2>/dev/null)
  [ -n "$platlib" ] && [ -d "$platlib/nvidia" ] || return 0
  so=$(find -L "$platlib/nvidia" -name "$stem$suffix" 2>/dev/null | sort | head -1)
  inc=$(find -L "$platlib/nvidia" -name "$header" 2>/dev/null | sort | head -1)
  [ -n "$so" ] && [ -n "$inc" ] || return 0
  mkdir -p "$dir/lib"
  for f in "$(dirname "$so")/$stem"*"$suffix"; do ln -sfn "$f" "$dir/lib/$(basename "$f")"; done
  ln -sfn "$stem$suffix" "$dir/lib/$stem.so"
  ln -sfn "$(dirname "$inc")" "$dir/include"
  export "$home=$dir" LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu-deps: $name from the Python wheel: $so"
}

# gpu_deps_use DIR PREFIX: unpack and export (see the top). Returns non-zero with one line on error.
gpu_deps_use() {
  local dir=$1 prefix=$2 deb
  ls "$dir"/*.deb >/dev/null 2>&1 || { echo "gpu-deps: no .deb files in $dir (make them with scripts/gpu-deps.sh pack)" >&2; return 1; }
  mkdir -p "$prefix" && prefix=$(realpath "$prefix") || return 1
  if [ ! -e "$prefix/.unpacked" ]; then
    # A package whose shared libraries the machine already has is left out: the machine's own
    # (newer) copies serve, and an older copy of ours on LD_LIBRARY_PATH would shadow them for
    # every program, Python's included.
    local known skipped= have; known=$(ldconfig -p 2>/dev/null); have=$(awk '{print $1}' <<<"$known")
    for deb in "$dir"/*.deb; do
      local libs; libs=$(_gpu_deps_list "$deb" | grep -E '^\./(usr/)?lib/x86_64-linux-gnu/[^/]*\.so\.[0-9.]*$' | xargs -rn1 basename)
      if [ -n "$libs" ] && [ -n "$have" ] && _gpu_deps_all_known "$libs" "$have"; then
        skipped+=" $(basename "$deb" .deb | cut -d_ -f1)"; continue
      fi
      _gpu_deps_unpack "$deb" "$prefix" || { echo "gpu-deps: cannot unpack $deb" >&2; return 1; }
    done
    if [ -f "$dir/cudnn-frontend-include.tar.gz" ]; then
      mkdir -p "$prefix/cudnn-frontend/include" && tar -C "$prefix/cudnn-frontend/include" -xzf "$dir/cudnn-frontend-include.tar.gz"
    fi
    # a development link (libpcre2-8.so) whose library was left out: to the machine's copy
    local link target
    while IFS= read -r link; do
      target=$(awk -v b="$(basename "$link")." 'index($1, b) == 1 {print $NF; exit}' <<<"$known")
      [ -n "$target" ] && ln -sfn "$target" "$link"
    done < <(find "$prefix/usr/lib/x86_64-linux-gnu" -maxdepth 1 -xtype l -name '*.so')
    touch "$prefix/.unpacked"
    echo "gpu-deps: unpacked into $prefix; the machine's own libraries serve for:${skipped:- none}"
  fi
  local usr=$prefix/usr lib=$prefix/usr/lib/x86_64-linux-gnu
  # the links update-alternatives makes when the packages are installed
  mkdir -p "$prefix/bin"
  local name
  for name in mpirun mpiexec mpicc mpicxx mpic++; do ln -sfn "$usr/bin/$name.openmpi" "$prefix/bin/$name"; done
  ln -sfn openblas-pthread/libblas.so.3 "$lib/libblas.so.3"
  ln -sfn openblas-pthread/liblapack.so.3 "$lib/liblapack.so.3"
  ln -sfn openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
  ln -sfn openblas-pthread/libopenblas.so "$lib/libopenblas.so"
  [ -e "$usr/lib/libpsm1/libpsm_infinipath.so.1.16" ] && ln -sfn ../libpsm1/libpsm_infinipath.so.1.16 "$lib/libpsm_infinipath.so.1"
  export PATH="$prefix/bin:$usr/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$prefix/lib/x86_64-linux-gnu:$lib/openblas-pthread:$lib/openmpi/lib:$lib/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$lib/pkgconfig:$usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"  # the .pc files say prefix=/usr
  export HDF5_ROOT="$lib/hdf5/serial"
  # cblas.h: Debian puts it on the compiler's path through an alternative (include/x86_64-linux-gnu)
  export CPATH="$usr/include/x86_64-linux-gnu/openblas-pthread${CPATH:+:$CPATH}"
  # OpenMPI finds its components, help texts and wrapper data under OPAL_PREFIX; PMIx likewise
  export OPAL_PREFIX="$usr"
  # PMIx: ours where it was unpacked (left out where the machine has its own library)
  if [ -d "$lib/pmix2/lib/pmix" ]; then export PMIX_PREFIX="$lib/pmix2" PMIX_MCA_mca_base_component_path="$lib/pmix2/lib/pmix"; fi
  export OMPI_MCA_plm_rsh_agent=  # no ssh here: one node only
  GPU_DEPS_CMAKE_ARGS="-DMPI_CXX_COMPILER=$prefix/bin/mpicxx -DMPI_C_COMPILER=$prefix/bin/mpicc -DMPIEXEC_EXECUTABLE=$prefix/bin/mpirun"
  GPU_DEPS_CMAKE_ARGS+=" -DBLA_VENDOR=OpenBLAS -DCMAKE_LIBRARY_PATH=$lib/openblas-pthread;$lib -DCMAKE_INCLUDE_PATH=$usr/include"
  # NCCL and cuDNN: the toolkit's if it has them, else the image's Python wheels
  _gpu_deps_from_wheel NCCL libnccl .so.2 nccl.h "$prefix/nvidia/nccl"
  _gpu_deps_from_wheel CUDNN libcudnn .so.9 cudnn.h "$prefix/nvidia/cudnn"
  [ -d "$prefix/cudnn-frontend/include" ] && export CUDNN_FRONTEND_INCLUDE_DIR="$prefix/cudnn-frontend/include"
  export GPU_DEPS_CMAKE_ARGS
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  case ${1:-} in
    pack) shift; gpu_deps_pack "$@" ;;
    *) echo "usage: scripts/gpu-deps.sh pack [DIR]   (or: source it and call gpu_deps_use DIR PREFIX)" >&2; exit 2 ;;
  esac
fi
