# Sourced by the end-to-end shell tests (tests/e2e/, tests/e2e_gpu/) with the script's own
# arguments: BIN=$1 (the shardgpt binary), T = a scratch folder removed on exit, mpirun allowed
# as root, fail() ends the test with one FAIL line.
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAIL: $*"; exit 1; }
# e2e_text LINES SENTENCE: $T/text.txt, SENTENCE on each of LINES lines.
e2e_text() { for _ in $(seq 1 "$1"); do echo "$2"; done > "$T/text.txt"; }
# e2e_prepare LINES SENTENCE: that text, tokenized by `shardgpt prepare` into $T/data.
e2e_prepare() { e2e_text "$1" "$2"; "$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || fail prepare; }
# expect_error WHAT GREP -- command...: the command exits non-zero with one stderr line that
# contains GREP (else fail); prints it and counts the case in n.
expect_error() {
  local what=$1 pat=$2; shift 3
  local err rc=0
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  [ $rc -ne 0 ] || fail "$what: exit 0, expected an error"
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "$what: expected one error line, got: $err"
  grep -qF -- "$pat" <<<"$err" || fail "$what: error does not say '$pat': $err"
  echo "ok   $what: $err"
  n=$((n + 1))
}
