#!/usr/bin/env bash
# scripts/gpu-check.sh --dry under the CUDA emulation (ctest gpu_check_dry, label gpu-emu), so
# that the script, which runs for real only on a machine with a GPU, cannot rot: it must exit 0
# and write a report with
#   - the machine section first, then the test sections layouts, kernels, nccl, training in that
#     order, each with its jobs passed and none failed or skipped;
#   - a summary line per ZeRO stage 0-3 with tokens/s, TFLOP/s, MFU and peak memory against
#     plan's prediction;
#   - a per-kernel table (CUDA events) naming every kernel a training step calls, with
#     non-negative figures, whose FLOPs sum to 6*B*T*(12*L*C^2 + Vp*C) + 6*L*B*T^2*C, the matmul
#     and attention FLOPs of a step counted from the shape alone (not from the table's per-call
#     formulas), and the roofline table for the same shape with the same sum;
#   - the attention section: "not available" or both backends' tokens/s;
#   - the --gelu fused line beside stage 0, with how many calls had cuBLASLt's epilogue.
# No figure of it is a GPU figure (the emulation runs on the CPU).
# And --sanitize: says it did not run, runs nothing else.
#   gpu_check_dry.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1 SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
rc=0
bash "$SRC/scripts/gpu-check.sh" --dry --build "$BUILD" --report "$T/report.txt" --steps 3 >"$T/out.txt" 2>&1 || rc=$?
if [ $rc -ne 0 ]; then cat "$T/out.txt"; echo "FAIL: gpu-check.sh --dry exited $rc"; exit 1; fi
[ -s "$T/report.txt" ] || { echo "FAIL: no report written"; exit 1; }
# the dry run's shape (scripts/gpu-check.sh): L=2, C=32, V=64 (Vp=128), B=2, T=16
python3 - "$T/report.txt" <<'PY'
import re, sys
rep = open(sys.argv[1]).read()
lines = rep.splitlines()
fail = []
def need(cond, what):
    if not cond: fail.append(what)
need("DRY RUN" in lines[0], "the first line says it is a dry run")
need(lines[1] == "== machine" and any(l.startswith("cores: ") or "cores: " in l for l in lines[2:12]),
     "the machine section first, with the cores")
# the test sections in the order that tells the most first, each passed with no failure
order = [m.group(1) for m in (re.match(r"^== tests: (\w+): ([0-9]+) passed, 0 failed, 0 skipped, [0-9]+ s$", l) for l in lines) if m and int(m.group(2)) > 0]
need(order == ["layouts", "kernels", "nccl", "training"], "the test sections layouts, kernels, nccl, training passed in that order (got %s)" % order)
need(lines.index(next(l for l in lines if l.startswith("== tests: layouts"))) < lines.index(next(l for l in lines if l.startswith("== benchmark"))),
     "the tests before the benchmarks")
num = r"[0-9]+(?:\.[0-9]+)?"
for s in range(4):
    pat = r"^stage %d: %s tokens/s \| %s TFLOP/s \| MFU %s%% \| peak memory %s GiB tracked \(plan predicts %s GiB\)$" % (
        s, num, num, num, num, num)
    need(any(re.match(pat, l) for l in lines), "a summary line for stage %d (%s)" % (s, pat))
# the two tables: rows "  name  numbers..." after their header lines
def table(header_start):
    i = next((k for k, l in enumerate(lines) if l.strip().startswith("kernel") and header_start in l), None)
    if i is None:
        return {}
    cols = lines[i].split()
    rows = {}
    for l in lines[i + 1:]:
        m = re.match(r"^  (\S.*?\S)\s{2,}(-?[0-9].*)$", l)
        if not m:
            break
        rows[m.group(1)] = m.group(2).split()
    return cols, rows
prof = table("ms/step")
roof = table("FLOP/byte")
need(prof and roof, "a per-kernel table and a roofline table")
L, C, Vp, B, T = 2, 32, 128, 2, 16
want = 6 * B * T * (12 * L * C * C + Vp * C) + 6 * L * B * T * T * C
kernels = ["encoder_forward", "encoder_backward", "layernorm_forward", "layernorm_backward", "matmul_forward",
           "matmul_backward", "attention_forward", "attention_backward", "gelu_forward", "gelu_backward",
           "residual_layernorm_forward", "crossentropy_softmax", "adamw (engine)"]
for name, (cols, rows) in (("per-kernel", prof), ("roofline", roof)):
    for k in kernels:
        need(k in rows, "%s table row %s" % (name, k))
    gcol = cols.index("GFLOP/step" if name == "per-kernel" else "GFLOP") - 1  # rows lack the name column
    for k, v in rows.items():
        nums = [float(x.rstrip("%")) for x in v if x not in ("-", "compute", "memory")]
        need(all(x >= 0 for x in nums), "%s row %s non-negative: %s" % (name, k, v))
    got = float(rows.get("all kernels", ["nan"] * 12)[gcol]) * 1e9
    need(abs(got - want) <= 1e-4 * want, "%s FLOPs sum %.6g == 6BT(12LC^2 + VpC) + 6LBT^2C = %d" % (name, got, want))
    calls = [int(v[cols.index("calls") - 1]) for k, v in rows.items() if k != "all kernels"]
    need(all(c > 0 for c in calls), "%s: every row has calls" % name)
# --gelu fused beside stage 0: its figures, and at least one call in cuBLASLt's epilogue (the
# emulation's cuBLASLt has the GELU epilogues)
gm = [re.match(r"^stage 0 --gelu fused: %s tokens/s \| MFU %s%% \| ([0-9]+) of ([0-9]+) calls ran the GELU in" % (num, num), l)
      for l in lines]
gm = [m for m in gm if m]
need(gm and 0 < int(gm[0].group(1)) <= int(gm[0].group(2)), "the --gelu fused summary line with epilogue calls")
att = [l for l in lines if l.startswith("attention own vs cudnn: not available") or re.match(r"^attention (own|cudnn)\s*: " + num + " tokens/s", l)]
need(att, "the attention section: not available, or both backends' tokens/s")
if fail:
    print("FAIL: the dry report lacks:\n  " + "\n  ".join(fail))
    print(rep)
    sys.exit(1)
print("gpu-check --dry report: tests, 4 stages, %d kernels per table, FLOPs sum %d, attention section: ok" % (len(prof[1]) - 1, want))
PY
# The budget: with less than the 5 s every step needs (--budget 4), nothing runs; every test job
# is reported "not run (out of the time budget)", the summary is written, and the exit is 3.
rc=0
bash "$SRC/scripts/gpu-check.sh" --dry --build "$BUILD" --report "$T/budget.txt" --steps 3 --budget 4 >"$T/budget.out" 2>&1 || rc=$?
jobs_not_run=$(grep -c '^  [a-z_0-9]*: not run (out of the time budget)' "$T/budget.txt" || true)
jobs_run=$(grep -cE '^  [a-z_0-9]*: (passed|FAILED|skipped)' "$T/budget.txt" || true)
[ $rc -eq 3 ] && [ "$jobs_not_run" -ge 4 ] && [ "$jobs_run" -eq 0 ] && grep -q '^== summary' "$T/budget.txt" ||
  { cat "$T/budget.txt"; echo "FAIL: --budget 4: exit $rc (want 3), $jobs_not_run jobs not run, $jobs_run run (want 0)"; exit 1; }
echo "gpu-check --dry --budget 4: exit 3, $jobs_not_run test jobs reported not run, none run: ok"
# --sanitize under the emulation: the section says it did not run (no GPU code runs here), and
# does nothing else (no tests, no benchmarks)
rc=0
bash "$SRC/scripts/gpu-check.sh" --dry --sanitize --build "$BUILD" --report "$T/san.txt" >"$T/san.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$T/san.out"; echo "FAIL: gpu-check.sh --dry --sanitize exited $rc"; exit 1; }
grep -q "^== compute-sanitizer: not run (the emulation runs no GPU code)" "$T/san.txt" && ! grep -q "^== gpu tests\|^== benchmark" "$T/san.txt" ||
  { cat "$T/san.txt"; echo "FAIL: the --sanitize report"; exit 1; }
echo "gpu-check --dry --sanitize: not run under the emulation, nothing else run: ok"
