#!/usr/bin/env bash
# HSDP across two hosts (network namespaces, tests/slurm/cluster.sh), the link of each shaped
# to 1 Gbit/s with tc: bench/hsdp_two_hosts.sh in its CHECK mode at a small size. It fails
# unless
#   - --shard-group-size auto resolves to G = 2 (the ranks of one host) with 2 groups;
#   - HSDP (G = 2) and ZeRO-3 over the 4 ranks have the losses of one process trained on the
#     same global batch (within 5e-4; fp32 sums in other orders);
#   - the bytes crossing h1's link (its veth's rx + tx counters, over the whole job) are 1 to
#     1.25 times the cross-group bytes the 4 ranks' ledgers count: the in-group collectives
#     stayed in shared memory, and the ledger counts what the wire carries.
# Usage: tests/slurm/hsdp.sh BUILD/shardgpt [SOURCE_DIR]. Root only (exit 77 otherwise).
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
CHECK=1 STEPS=6 ROUNDS=1 LAYERS=2 EMBD=128 DTYPE=fp32 RATE=1gbit exec bash "$SRC/bench/hsdp_two_hosts.sh" "$1" "$SRC"
