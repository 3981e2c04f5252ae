#!/usr/bin/env bash
# shardgpt against PyTorch, side by side (a benchmark: it prints figures, it asserts nothing).
# For each dtype (fp32, bf16) and config (tiny, small, gpt2 = GPT-2 124M shape; llama = a Llama
# of the 124M class, llama-small; bench_train's, CONFIGS="llama-small llama" for the Llama pair),
# ROUNDS times alternately: build/bench/bench_train (1 rank x 2 threads, `shardgpt train`'s
# compute choice) then bench/torch_train.py (the same model and step in PyTorch; bf16 =
# torch.autocast("cpu", torch.bfloat16)). Prints every pair, then per config the median
# tokens/s of each and the median of the per-round ratios (the machine is shared: only ratios
# measured side by side mean much).
#   bench/vs_torch.sh [build-dir]        env: ROUNDS=3 STEPS=10 TORCH_MAX_S=120 CONFIGS="tiny small gpt2"
#                                             DTYPES="fp32 bf16" PROFILE=1 (adds bench_train's per-kernel table)
# Needs Debian's python3-torch for /usr/bin/python3 (bench only; never a test dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-10} TORCH_MAX_S=${TORCH_MAX_S:-120}
CONFIGS=${CONFIGS:-"tiny small gpt2"} DTYPES=${DTYPES:-"fp32 bf16"} PROFILE=${PROFILE:-0}
PY=/usr/bin/python3
"$PY" -c "import torch" 2>/dev/null || { echo "vs_torch: needs python3-torch for $PY (apt-get install python3-torch)"; exit 1; }
[ -x "$BUILD/bench/bench_train" ] || { echo "vs_torch: build $BUILD/bench/bench_train first (scripts/build.sh)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench/machine.sh
echo "torch $("$PY" -c 'import torch; print(torch.__version__)')"
results=$(mktemp); trap 'rm -f "$results"' EXIT
for dtype in $DTYPES; do
  for config in $CONFIGS; do
    for r in $(seq 1 "$ROUNDS"); do
      s=$("$BUILD"/bench/bench_train --config "$config" --dtype "$dtype" --threads 2 --steps "$STEPS" --profile "$PROFILE")
      t=$(OMP_WAIT_POLICY=PASSIVE "$PY" bench/torch_train.py --config "$config" --dtype "$dtype" --threads 2 \
            --steps "$STEPS" --max-seconds "$TORCH_MAX_S")
      st=$(grep -o '[0-9]* tokens/s' <<<"$s" | head -1 | cut -d' ' -f1)
      tt=$(grep -o '[0-9]* tokens/s' <<<"$t" | head -1 | cut -d' ' -f1)
      sg=$(grep -o '[0-9.]* GFLOP/s' <<<"$s" | head -1 | cut -d' ' -f1)
      compute=$(grep -o 'compute=[a-z0-9]*' <<<"$s" | cut -d= -f2)
      echo "$dtype $config round $r: shardgpt $st tok/s (compute $compute, $sg GFLOP/s) | torch $tt tok/s | ratio $(awk -v a="$st" -v b="$tt" 'BEGIN{printf "%.2f", a/b}')"
      [ "$PROFILE" = 1 ] && [ "$r" = 1 ] && sed -n '/per-kernel/,$p' <<<"$s"
      echo "$dtype $config $st $tt $sg $compute" >> "$results"
    done
  done
done
echo
"$PY" - "$results" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
print("| dtype | config | shardgpt tok/s | compute | model GFLOP/s | PyTorch tok/s | ratio (median of rounds) |")
print("|---|---|---|---|---|---|---|")
seen = []
for r in rows:
    if (r[0], r[1]) not in seen: seen.append((r[0], r[1]))
for d, c in seen:
    g = [r for r in rows if r[0] == d and r[1] == c]
    s, t = [float(r[2]) for r in g], [float(r[3]) for r in g]
    ratio = st.median(a / b for a, b in zip(s, t))
    print(f"| {d} | {c} | {st.median(s):,.0f} | {g[0][5]} | {st.median(float(r[4]) for r in g):.1f} | "
          f"{st.median(t):,.0f} | **{ratio:.2f}x** ({len(g)} rounds) |")
# our bf16 against our own fp32 (bf16's speed-up, per config), round r against round r
for c in dict.fromkeys(c for _, c in seen):
    f = [float(r[2]) for r in rows if r[0] == "fp32" and r[1] == c]
    b = [float(r[2]) for r in rows if r[0] == "bf16" and r[1] == c]
    if f and b:
        print(f"shardgpt bf16 / shardgpt fp32, {c}: {st.median(x / y for x, y in zip(b, f)):.2f}x "
              f"(median of {min(len(b), len(f))} round pairs)")
PY
