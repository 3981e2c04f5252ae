#!/usr/bin/env bash
# Checks the code generation of the CPU kernels for several x86 targets, whatever CPU runs it:
# compiles model/kernels_cpu.cc, kernels_cpu_bf16.cc, optimizer.cc, attention_cpu_tiled.cc and
# kernels_cpu_llama.cc with the flags CMake gives them (root CMakeLists.txt: -O3, -fopenmp,
# -fno-math-errno and -mprefer-vector-width=512 for the fp32 files, kernels_cpu_llama.cc
# included, -fno-trapping-math for the bf16 file and, on
# targets without AVX-512, for the fp32 files too) for each target below, and checks GCC's
# optimization record (-fsave-optimization-record) against the loops marked in the sources.
#
# A marked loop carries `// vec: NAME` on its `for` line (or on the line that calls a helper
# whose loop is meant, e.g. base/bf16.h's array conversions). A report belongs to the marked
# loop whose lines (the `#pragma omp simd` above it, the `for` line, the body) contain the
# report's location or, for a loop GCC places inside an inlined helper (Ld, FloatToBf16), one
# of the call sites of its inlining chain. Every function that holds a copy of a marked loop
# (each template instance, each inlined copy) must report it "vectorized using W byte vectors":
#   W = 64 on AVX-512 targets for the fp32 files (-mprefer-vector-width=512), else 32.
# Every marker in a .cc file must be seen in its own translation unit; a marker in a header in
# at least one. On AVX-512 targets the register tiles of attention_cpu_tiled.cc (GCC vector
# extensions, 16 floats) must compile to whole zmm operations: no -Wvector-operation-performance
# warning, and zmm FMAs in the object code.
#
# Prints one line per target; on a failure one line per loop, "file:line: target: what", and
# exits 1. Exit 77 (CTest: skipped) when the compiler is not GCC (the record is GCC's).
#
# Usage: scripts/check-vectorization.sh [--keep DIR]   (CXX: the compiler, default g++;
#        SHARDGPT_VEC_TARGETS: a subset of the target names below; DNNL_INCLUDE_DIR if not
#        in the default include path)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
CXX=${CXX:-g++}
keep=""
if [[ "${1:-}" == "--keep" ]]; then keep=$2; fi

macros=$("$CXX" -dM -E -x c++ /dev/null 2>/dev/null || true)
if [[ "$macros" != *__GNUC__* || "$macros" == *__clang__* ]]; then
  echo "check-vectorization: $CXX is not GCC (the check reads GCC's optimization record): skipped"
  exit 77
fi
command -v python3 >/dev/null || { echo "check-vectorization: needs python3" >&2; exit 2; }

# name|-march flags. zen4: what GCC 12's -march=native resolves to on an AMD EPYC Zen 4 (GCC 12
# has no znver4: znver3 tuning plus the AVX-512 feature flags).
declare -a TARGETS=(
  "x86-64-v3|-march=x86-64-v3"
  "x86-64-v4|-march=x86-64-v4"
  "zen4|-march=znver3 -mtune=znver3 -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx512cd -mavx512ifma -mavx512vbmi -mavx512vbmi2 -mavx512vnni -mavx512bitalg -mavx512vpopcntdq -mavx512bf16 -mgfni"
  "sapphirerapids|-march=sapphirerapids"
)
FP32_FILES=(kernels_cpu.cc optimizer.cc attention_cpu_tiled.cc kernels_cpu_llama.cc)
BF16_FILES=(kernels_cpu_bf16.cc)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -n "$keep" ]] && { mkdir -p "$keep"; work=$(cd "$keep" && pwd); trap - EXIT; }

includes=(-I"$root")
case "${DNNL_INCLUDE_DIR:-}" in ""|/usr/include|/usr/local/include) ;; *) includes+=(-isystem "$DNNL_INCLUDE_DIR") ;; esac
common=(-O3 -DNDEBUG -fopenmp -std=gnu++17 "${includes[@]}" -fsave-optimization-record -S)

jobs_list="$work/jobs"
: >"$jobs_list"
for t in "${TARGETS[@]}"; do
  name=${t%%|*}
  march=${t#*|}
  if [[ -n "${SHARDGPT_VEC_TARGETS:-}" && " $SHARDGPT_VEC_TARGETS " != *" $name "* ]]; then continue; fi
  avx512=no
  # shellcheck disable=SC2086
  if [[ "$("$CXX" $march -dM -E -x c++ /dev/null)" == *__AVX512F__* ]]; then avx512=yes; fi
  echo "$name $avx512" >>"$work/targets"
  for f in "${FP32_FILES[@]}" "${BF16_FILES[@]}"; do
    extra="-fno-math-errno -mprefer-vector-width=512"
    [[ $avx512 == no ]] && extra="$extra -fno-trapping-math"
    [[ " ${BF16_FILES[*]} " == *" $f "* ]] && extra="-fno-trapping-math"
    [[ $f == attention_cpu_tiled.cc ]] && extra="$extra -Wvector-operation-performance"
    mkdir -p "$work/$name"
    printf '%s\n' "cd '$work/$name' && $CXX $march ${common[*]} $extra -o '${f%.cc}.s' '$root/model/$f' 2>'${f%.cc}.log' || { echo '$name: $f: compile failed:'; cat '${f%.cc}.log'; exit 255; }" >>"$jobs_list"
  done
done
[[ -s "$jobs_list" ]] || { echo "check-vectorization: no target selected (SHARDGPT_VEC_TARGETS=${SHARDGPT_VEC_TARGETS:-})" >&2; exit 2; }
tr '\n' '\0' <"$jobs_list" | xargs -0 -P "$(nproc)" -n 1 bash -c

python3 - "$root" "$work" <<'PY'
import glob, gzip, json, os, re, sys

root, work = sys.argv[1], sys.argv[2]
model = os.path.join(root, "model")
units = ["kernels_cpu.cc", "kernels_cpu_bf16.cc", "optimizer.cc", "attention_cpu_tiled.cc", "kernels_cpu_llama.cc"]
fp32_units = {"kernels_cpu.cc", "optimizer.cc", "attention_cpu_tiled.cc", "kernels_cpu_llama.cc"}
marked_files = units + ["kernels_cpu_internal.h", "attention_cpu_tiled.h"]

# Markers: name, file, first and last line of the loop.
markers = []
for f in marked_files:
    path = os.path.join(model, f)
    if not os.path.exists(path):
        continue
    lines = open(path).read().split("\n")
    for i, line in enumerate(lines):
        m = re.search(r"//\s*vec:\s*([A-Za-z0-9_]+)", line)
        if not m:
            continue
        first = i
        j = i - 1
        while j >= 0 and lines[j].strip() == "":
            j -= 1
        if j >= 0 and lines[j].lstrip().startswith("#pragma omp") and "simd" in lines[j]:
            first = j
        code = lambda s: s.split("//")[0]
        depth = code(line).count("{") - code(line).count("}")
        last = i
        # to the end of the loop's statement: its braces closed, or its single statement's ';'
        while (depth > 0 or not code(lines[last]).rstrip().endswith((";", "}"))) and last + 1 < len(lines):
            last += 1
            depth += code(lines[last]).count("{") - code(lines[last]).count("}")
        markers.append({"name": m.group(1), "file": path, "first": first + 1, "last": last + 1,
                        "line": i + 1, "rel": "model/" + f})
names = [m["name"] for m in markers]
dups = sorted({n for n in names if names.count(n) > 1})
if dups:
    print("check-vectorization: marker names used twice: " + ", ".join(dups))
    sys.exit(1)

def marker_at(file, line):
    best = None
    for m in markers:
        if m["file"] == file and m["first"] <= line <= m["last"]:
            if best is None or m["last"] - m["first"] < best["last"] - best["first"]:
                best = m
    return best

def walk(rs):
    for r in rs:
        yield r
        yield from walk(r.get("children", []))

def realpath(p):
    return os.path.realpath(p) if p else p

failures = []
summary = []
for tline in open(os.path.join(work, "targets")):
    target, avx512 = tline.split()
    seen_header = {}  # marker name -> True once seen in some unit
    counts = {}
    for unit in units:
        base = unit[:-3]
        width = 64 if (avx512 == "yes" and unit in fp32_units) else 32
        recs = glob.glob(os.path.join(work, target, "*" + base + "*.opt-record.json.gz"))
        recs = [r for r in recs if os.path.basename(r).startswith(base + ".")]
        if len(recs) != 1:
            failures.append(f"model/{unit}: {target}: no optimization record ({recs})")
            continue
        data = json.load(gzip.open(recs[0]))
        groups = {}  # (marker name, function) -> list of widths (0: a failure report)
        for r in walk(data[2] if len(data) > 2 else []):
            msg = "".join(x if isinstance(x, str) else x.get("expr", "") for x in r.get("message", []))
            kind = r.get("kind")
            mw = re.match(r"loop vectorized using (\d+) byte vectors", msg)
            if mw and kind == "success":
                w = int(mw.group(1))
            elif kind == "failure" and msg.startswith("couldn't vectorize loop"):
                w = 0
            else:
                continue
            cands = []
            if "location" in r:
                cands.append(r["location"])
            for link in r.get("inlining_chain", []):
                if "site" in link:
                    cands.append(link["site"])
            for c in cands:
                m = marker_at(realpath(os.path.join(os.path.dirname(recs[0]), c["file"])) if not os.path.isabs(c["file"]) else realpath(c["file"]), c["line"])
                if m:
                    groups.setdefault((m["name"], r.get("function", "?")), []).append(w)
                    break
        seen = {}
        for (name, fn), ws in sorted(groups.items()):
            seen[name] = True
            m = next(x for x in markers if x["name"] == name)
            best = max(ws)
            if best < width:
                what = "not vectorised" if best == 0 else f"vectorised at {best} bytes, expected {width}"
                failures.append(f"{m['rel']}:{m['line']}: {target}: vec: {name}: {what} (in {fn}, compiling model/{unit})")
        for m in markers:
            if m["name"] in seen:
                seen_header[m["name"]] = True
            elif m["rel"] == "model/" + unit:
                failures.append(f"{m['rel']}:{m['line']}: {target}: vec: {m['name']}: no vectorised loop reported here")
        counts[unit] = (len(seen), width)
        if unit == "attention_cpu_tiled.cc" and avx512 == "yes":
            log = open(os.path.join(work, target, base + ".log")).read()
            for w in re.finditer(r"^(\S+?):(\d+):\d+: warning: (vector operation will be expanded [^\[]*)", log, re.M):
                failures.append(f"model/{unit}:{w.group(2)}: {target}: register tile: {w.group(3).strip()}")
            asm = open(os.path.join(work, target, base + ".s")).read()
            if not re.search(r"vfmadd\d+ps\s[^\n]*%zmm", asm):
                failures.append(f"model/{unit}: {target}: register tiles: no zmm FMA in the object code")
    for m in markers:
        if not m["rel"].endswith(".cc") and m["name"] not in seen_header:
            failures.append(f"{m['rel']}:{m['line']}: {target}: vec: {m['name']}: no vectorised loop reported in any unit")
    summary.append(f"{target} (AVX-512: {avx512}): " + ", ".join(
        f"{u} {n} marked loops at {w} bytes" for u, (n, w) in counts.items()))

for s in summary:
    print("check-vectorization: " + s)
for f in failures:
    print(f)
if failures:
    print(f"check-vectorization: FAILED: {len(failures)} loop(s) not vectorised as intended")
    sys.exit(1)
print(f"check-vectorization: OK: {len(markers)} marked loops on {len(summary)} targets")
PY
