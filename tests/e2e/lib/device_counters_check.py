# Checks one `train --log` JSONL of a 4-step run (tests/e2e/cpu_block_cache.sh,
# tests/e2e_gpu/device_counters.sh): from step 2 on, on every rank (*_per_rank),
#   device_frees == 0 in every row;
#   device_allocations == 0 in every row, but for at most one block per rank over the run (the
#     engine drops a reduce-scatter's send buffer when a poll first sees the collective complete,
#     so how many are alive at once depends on timing, and a later step may need one more than
#     step 1 did; that block is then kept for good);
#   host_syncs <= 1 where the device counts them (absent: not checked).
# Prints the per-step counters first.   python3 device_counters_check.py LOG WHAT
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1])]
what = sys.argv[2]
assert [r["step"] for r in rows] == [1, 2, 3, 4], (what, [r["step"] for r in rows])


def per_step(key):
    return " ".join("/".join(str(v) for v in r[key + "_per_rank"]) if key + "_per_rank" in r else "?" for r in rows)


print("%-20s allocations %-24s frees %-16s host syncs %s" %
      (what, per_step("device_allocations"), per_step("device_frees"), per_step("host_syncs")))
assert "device_allocations_per_rank" in rows[0], "%s: no device counters in the rows" % what
later = rows[1:]
ranks = len(rows[0]["device_allocations_per_rank"])
late = [sum(r["device_allocations_per_rank"][k] for r in later) for k in range(ranks)]
assert max(late) <= 1, "%s: device memory allocated inside steps after the first (per rank, steps 2-%d): %s" % (
    what, len(rows), [(r["step"], r["device_allocations_per_rank"]) for r in later if any(r["device_allocations_per_rank"])])
for key, limit in (("device_frees", 0), ("host_syncs", 1)):
    if key + "_per_rank" not in rows[0]:
        assert key == "host_syncs", "%s: no %s_per_rank in the rows" % (what, key)
        continue  # not counted by this device
    bad = [(r["step"], r[key + "_per_rank"]) for r in later if max(r[key + "_per_rank"]) > limit]
    assert not bad, "%s: %s above %d inside steps after the first (step, per rank): %s" % (what, key, limit, bad)
