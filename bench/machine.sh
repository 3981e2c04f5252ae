#!/usr/bin/env bash
# Prints the hardware a benchmark figure belongs to, one line: the date, the CPU model (lscpu),
# the cores this process may use, whether the CPU has AVX-512, AVX512-BF16 and AMX-BF16 (what
# the bf16 figures need: oneDNN's and PyTorch's fast bf16 paths need AVX512-BF16 or AMX), and
# the load average. Sourced or run by every bench driver before its first figure.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { if grep -qw "$1" <<<"$flags"; then echo yes; else echo no; fi; }
echo "machine: $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)" \
     "(family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'));" \
     "$(nproc) cores usable; avx512f: $(has avx512f), avx512_bf16: $(has avx512_bf16), amx_bf16: $(has amx_bf16);" \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
