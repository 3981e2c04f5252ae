#!/usr/bin/env bash
# ZeRO-3 over 4 ranks against HSDP (--shard-group-size auto = 2 ranks per host) on 2 hosts x 2
# ranks, the hosts being network namespaces joined by a bridge (tests/slurm/cluster.sh), the
# link of each host shaped by tc (token bucket, RATE), shared memory inside a host; Slurm
# (private slurmctld/slurmd per host) launches the ranks with srun --mpi=pmix. Side by side in
# one run, alternating (zero3, hsdp) x ROUNDS: inter-host bytes per step as the ledger counts
# them and as h1's interface counts them, step time (median over steps 2..), final loss.
#
#   sudo bench/hsdp_two_hosts.sh BUILD/shardgpt [SOURCE_DIR]
# Knobs (environment): RATE (1gbit), STEPS (12), ROUNDS (2), DTYPE (bf16), LAYERS (4),
# EMBD (256), SEQ (64).
# CHECK=1 (tests/slurm/hsdp.sh): also train one process on the same global batch and FAIL
# unless both runs' losses match it within LOSS_TOL and, for HSDP, the bytes crossing h1's
# link lie within [1, 1.25] x the cross-group bytes the ledgers of the 4 ranks count.
#
# Inter-host bytes, ledger: HSDP: every rank's comm_bytes_across_groups (the replica
# all-reduces, which are the only data collectives between the hosts); ZeRO-3: the ring
# model's share, half of all bytes sent (ranks 0,1 | 2,3: two of the ring's four links cross).
# Interface: rx + tx of h1's veth over the whole job (MPI wire-up and control included)
# divided by STEPS. Root only (exit 77 otherwise).
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(realpath "${2:-$(dirname "$0")/..}")
RATE=${RATE:-1gbit} STEPS=${STEPS:-12} ROUNDS=${ROUNDS:-2} DTYPE=${DTYPE:-bf16}
LAYERS=${LAYERS:-4} EMBD=${EMBD:-256} SEQ=${SEQ:-64} CHECK=${CHECK:-0} LOSS_TOL=${LOSS_TOL:-5e-4}
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: starts Slurm daemons and network namespaces: run as root"; exit 77; fi
"$SRC/bench/machine.sh"
source "$SRC/tests/slurm/cluster.sh"
slurm_install || { echo "FAIL: cannot install slurm-wlm"; exit 1; }
for c in ip tc nsenter unshare; do command -v $c >/dev/null || { echo "FAIL: needs $c (iproute2, util-linux)"; exit 1; }; done

slurm_work_dir /var/tmp/shardgpt-hsdp.XXXXXX || fail "mktemp"
cp "$BIN" "$T/shardgpt" && BIN=$T/shardgpt
netns_pick_prefix
extra_cleanup() { netns_hosts_down "$P" 2; }
slurm_test_scaffold "$T" "$C" 840

t0=$SECONDS
# 2 CPUs per host: Slurm 22.05 refuses --ntasks-per-node above a node's CPUs even with --overcommit
netns_cluster_up "$T" "$C" 2 || fail "two-host cluster"
for i in 1 2; do netns_shape "$P" "$i" "$RATE" || fail "tc qdisc tbf on host h$i's link refused"; done
echo "cluster up in $((SECONDS - t0)) s: h1, h2 (2 ranks each); links shaped: $(tc qdisc show dev "$P-v1" | head -1)"

for i in $(seq 1 400); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || fail prepare
# one sequence per rank per step (4 ranks): a communication-bound step
FLAGS="--data $T/data/train.bin --seq-len $SEQ --n-layer $LAYERS --n-embd $EMBD --n-head 4 --steps $STEPS --lr 1e-3"
FLAGS="$FLAGS --seed 5 --micro-batch 1 --batch-tokens $((4 * SEQ)) --dtype $DTYPE --compute-dtype fp32 --zero-stage 3 --threads 1 --quiet"
link=/sys/class/net/$P-v1/statistics
bytes() { echo $(( $(cat "$link/rx_bytes") + $(cat "$link/tx_bytes") )); }

# run NAME EXTRA-FLAGS: one 2-host job; prints nothing, leaves $T/NAME.jsonl and $T/NAME.link
run() {
  local name=$1 extra=$2 b0 b1 id
  b0=$(bytes)
  id=$(sbatch --parsable -N 2 --ntasks=4 --ntasks-per-node=2 --overcommit --chdir="$T" --output="$T/$name.out" \
    --wrap "export OMPI_MCA_mpi_yield_when_idle=1; srun --mpi=pmix --kill-on-bad-exit=1 $BIN train $FLAGS $extra --log $T/$name.jsonl") \
    || fail "sbatch $name"
  wait_job "$id" 600 || { tail -20 "$T/$name.out"; fail "job $name did not end"; }
  b1=$(bytes)
  expect_job "$id" COMPLETED 0:0 || { tail -20 "$T/$name.out"; fail "job $name"; }
  echo $((b1 - b0)) > "$T/$name.link"
}

for r in $(seq 1 "$ROUNDS"); do
  run "zero3-$r" ""
  run "hsdp-$r" "--shard-group-size auto"
  echo "round $r done [$((SECONDS - t0)) s]"
done
if [ "$CHECK" = 1 ]; then
  # the same global batch on one process (4 sequences per step), in the root namespace
  "$BIN" train $FLAGS --micro-batch 4 --log "$T/one.jsonl" >/dev/null || fail "single-process reference"
fi

/usr/bin/python3 - "$T" "$ROUNDS" "$STEPS" "$CHECK" "$LOSS_TOL" "$RATE" <<'PY'
import json, statistics, sys
T, rounds, steps, check, tol, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", float(sys.argv[5]), sys.argv[6]
def rows(n): return [json.loads(l) for l in open(f"{T}/{n}.jsonl")]
res, ok = {}, True
for kind in ("zero3", "hsdp"):
    ledger, link, ms, loss = [], [], [], None
    for r in range(1, rounds + 1):
        rs = rows(f"{kind}-{r}")
        assert [x["step"] for x in rs] == list(range(1, steps + 1)), f"{kind}-{r}: steps logged {[x['step'] for x in rs]}"
        if kind == "hsdp":
            assert rs[0].get("shard_group_size") == 2 and rs[0].get("groups") == 2, \
                f"--shard-group-size auto gave G={rs[0].get('shard_group_size')}, groups={rs[0].get('groups')} (expected 2, 2)"
            sent = sum(sum(x["comm_bytes_across_groups_per_rank"]) for x in rs)
        else:
            sent = sum(sum(x["comm_bytes_per_rank"]) for x in rs) / 2  # ring model: 2 of 4 links cross
        ledger.append(sent / steps)
        link.append(int(open(f"{T}/{kind}-{r}.link").read()) / steps)
        ms.extend(x["ms"] for x in rs[1:])
        loss = rs[-1]["loss"]
        res[kind] = dict(ledger=statistics.median(ledger), link=statistics.median(link), ms=statistics.median(ms),
                         loss=loss, rows=rs, link_all=link, ledger_all=ledger)
z, h = res["zero3"], res["hsdp"]
print(f"2 hosts x 2 ranks, link shaped to {rate} (tc tbf), {steps} steps x {rounds} round(s), alternating:")
print(f"{'':22} {'inter-host MB/step':>19} {'(ledger)':>9} {'step ms':>8} {'final loss':>10}")
print(f"{'':22} {'interface':>19} {'':>9} {'median':>8}")
for name, k in (("ZeRO-3, 4 ranks", z), ("HSDP, G=2 (auto)", h)):
    print(f"{name:22} {k['link'] / 1e6:19.3f} {k['ledger'] / 1e6:9.3f} {k['ms']:8.1f} {k['loss']:10.4f}")
print(f"ZeRO-3 / HSDP: inter-host bytes {z['link'] / h['link']:.2f}x (interface), {z['ledger'] / h['ledger']:.2f}x (ledger); "
      f"step time {z['ms'] / h['ms']:.2f}x")
print("(ledger: HSDP = cross-group all-reduces of all ranks; ZeRO-3 = half of all bytes sent, the ring model's "
      "crossing share; interface: rx+tx of h1's link over the job / steps)")
if check:
    ref = {x["step"]: x["loss"] for x in map(json.loads, open(f"{T}/one.jsonl"))}
    for kind in ("zero3", "hsdp"):
        d = max(abs(x["loss"] - ref[x["step"]]) for x in res[kind]["rows"])
        print(f"check: {kind} losses within {d:.2e} of one process on the same global batch (tolerance {tol})")
        ok &= d < tol
    for led, lnk in zip(h["ledger_all"], h["link_all"]):
        ratio = lnk / led
        print(f"check: HSDP bytes across h1's link / cross-group bytes in the ledgers = {ratio:.3f} (expected 1 to 1.25)")
        ok &= 1.0 <= ratio <= 1.25
sys.exit(0 if ok else 1)
PY
rc=$?
[ $rc -eq 0 ] || fail "see the checks above"
echo "hsdp two hosts ok in $((SECONDS - t0)) s"
