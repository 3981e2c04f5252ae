#!/usr/bin/env bash
# scripts/plot.py draws a PNG from two small JSONL logs of the trainer's format (train loss on
# every step, val_loss on some), and refuses a log that is not JSONL with one error line.
# Skipped (77) where Debian's python3-matplotlib is not installed.
set -euo pipefail
SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "skipped: python3-matplotlib is not installed (apt-get install python3-matplotlib)"; exit 77
fi
for name in a b; do
  /usr/bin/python3 - "$T/$name.jsonl" "$name" <<'PY'
import json, math, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 41):
        j = {"step": s, "tokens": s * 2048, "loss": 5.5 * math.exp(-s / (15 if sys.argv[2] == "a" else 10))}
        if s % 10 == 0:
            j["val_loss"] = j["loss"] + 0.1
        f.write(json.dumps(j) + "\n")
PY
done
"$SRC"/scripts/plot.py -o "$T/c.png" "$T/a.jsonl" "$T/b.jsonl" --label A --label B
# a PNG (signature), of real size
[ "$(head -c 8 "$T/c.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]
[ "$(stat -c %s "$T/c.png")" -gt 10000 ]
echo "not json" > "$T/bad.jsonl"
if err=$("$SRC"/scripts/plot.py -o "$T/d.png" "$T/bad.jsonl" 2>&1); then echo "accepted a bad log"; exit 1; fi
[ "$(echo "$err" | wc -l)" -eq 1 ] && grep -q "bad.jsonl:1: not JSON" <<<"$err"
[ ! -e "$T/d.png" ]
echo "plot: ok"
