#!/usr/bin/env bash
# Prints the hardware a benchmark figure belongs to, one line: the date, the CPU model (lscpu),
# the cores this process may use, whether the CPU has AVX-512, AVX512-BF16 and AMX-BF16 (what
# the bf16 figures need: oneDNN's and PyTorch's fast bf16 paths need AVX512-BF16 or AMX), the
# -march/-mtune the C++ compiler (CXX, default c++) resolves for -march=native (the code the
# kernels were built for on this host), and the load average. Sourced or run by every bench
# driver before its first figure.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
cxx=${CXX:-c++}
native=$("$cxx" -march=native -Q --help=target 2>/dev/null |
         awk '$1 == "-march=" && !m {m = $2} $1 == "-mtune=" && !t {t = $2} END {if (m) printf "-march=%s -mtune=%s", m, t}')
has() { if grep -qw "$1" <<<"$flags"; then echo yes; else echo no; fi; }
echo "machine: $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)" \
     "(family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'));" \
     "$(nproc) cores usable; avx512f: $(has avx512f), avx512_bf16: $(has avx512_bf16), amx_bf16: $(has amx_bf16);" \
     "native: ${native:-unknown} ($cxx $("$cxx" -dumpfullversion 2>/dev/null || echo "not found"));" \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
