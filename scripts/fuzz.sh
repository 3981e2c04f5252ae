#!/usr/bin/env bash
# Runs one fuzz target for SECONDS (default 60) on its corpus:
#   scripts/fuzz.sh TARGET [SECONDS] [extra libFuzzer flags...]
# TARGET is one of: token_shard llmc_model tokenizer ckpt_index ckpt_shard prepare cli_numbers
# safetensors tokenizer_json hf_config.
# Builds the sanitizer build (build-asan/, clang, ASan + UBSan, libFuzzer) when the target is
# missing. The corpus grows in build-asan/fuzz/corpus/TARGET (seeds: build-asan/fuzz/seeds);
# a finding (crash, contract violation, leak, timeout, allocation over the limit) stops the
# run, is saved under build-asan/fuzz/findings/TARGET/ and makes this script fail: fix it and
# copy the input to tests/fuzz/regressions/TARGET/, where CTest replays it in every build.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:?usage: scripts/fuzz.sh TARGET [SECONDS] [libFuzzer flags...]}
SECONDS_TO_RUN=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
BUILD=${BUILD_ASAN:-build-asan}
BIN="$BUILD/tests/fuzz/${TARGET}_fuzz"
if [ ! -x "$BIN" ]; then
  SHARDGPT_SANITIZE_BUILD_ONLY=1 scripts/test-sanitize.sh
fi
[ -x "$BIN" ] || { echo "fuzz.sh: no target '$TARGET' ($BIN)" >&2; exit 2; }
SEEDS="$BUILD/fuzz/seeds/$TARGET"
# one maker at a time: test-sanitize.sh starts two targets at once
mkdir -p "$BUILD/fuzz"
flock "$BUILD/fuzz/.seeds.lock" sh -c '[ -d "$1" ] || "$2" "$3" >/dev/null' _ "$SEEDS" "$BUILD/tests/fuzz/fuzz_make_seeds" \
  "$BUILD/fuzz/seeds"
CORPUS="$BUILD/fuzz/corpus/$TARGET" FINDINGS="$BUILD/fuzz/findings/$TARGET"
mkdir -p "$CORPUS" "$FINDINGS"
DIRS=("$CORPUS" "$SEEDS")
REG="tests/fuzz/regressions/$TARGET"
[ -d "$REG" ] && [ -n "$(ls -A "$REG")" ] && DIRS+=("$REG")
# Inputs up to 64 KiB (the seeds are 1-30 KiB). An allocation over 128 MiB is more than any
# such file can justify, so it counts as a finding; so does a single input running over 10 s.
case "$TARGET" in
  ckpt_index|ckpt_shard|llmc_model|safetensors|tokenizer_json) MAX_LEN=65536 ;;
  hf_config) MAX_LEN=16384 ;;
  *) MAX_LEN=8192 ;;
esac
# allocator_may_return_null: an impossible request (over ASan's 1 TiB maximum) returns NULL, as
# glibc's malloc does, instead of aborting; libhdf5 asks for such sizes when a crafted object
# header says so, and then fails cleanly. Anything from 128 MiB up is still a finding.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
exec "$BIN" "${DIRS[@]}" -max_total_time="$SECONDS_TO_RUN" -max_len="$MAX_LEN" -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=128 -artifact_prefix="$FINDINGS/" -print_final_stats=1 "$@"
