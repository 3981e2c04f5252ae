#!/usr/bin/python3
"""PyTorch DDP peer of `mpirun -np N bench_train --threads 1`: the same GPT-2 model and step as
bench/torch_train.py (forward, backward, clip, AdamW), data parallel over N processes with
torch.nn.parallel.DistributedDataParallel on the gloo backend (PyTorch's CPU backend), each
process with its own micro-batch of B x T synthetic tokens and one thread. Prints the median
step's tokens/s OF THE WHOLE JOB (N x B x T / step time) in bench_train's format.

Bench only (Debian's python3-torch for /usr/bin/python3); never a test or CI dependency.
  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_ddp.py --config tiny --ranks 2
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import CONFIGS, GPT  # noqa: E402  (the model, written once)


def worker(rank, a, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.set_num_threads(a.threads)
    torch.manual_seed(42)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    L, H, C, V, maxT, B, T = CONFIGS[a.config]
    if a.micro_batch:
        B = a.micro_batch
    if a.seq_len:
        T = a.seq_len
    # The only buffer is the constant causal mask (bool, which gloo cannot broadcast, and DDP
    # broadcasts buffers at construction): make it a plain attribute; every rank builds the same.
    net = GPT(L, H, C, V, maxT)
    mask = net.mask
    del net._buffers["mask"]
    net.mask = mask
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
    times = []
    for s in range(a.steps):
        x, y = torch.randint(0, V, (B, T), generator=gen), torch.randint(0, V, (B, T), generator=gen)
        dist.barrier()  # every rank starts the step together, as bench_train's ranks do
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()  # DDP all-reduces the gradient buckets during backward
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        if s >= 2:  # skip warm-up, as bench_train does
            times.append(time.perf_counter() - t0)
    if rank == 0:
        times.sort()
        med = times[len(times) // 2]
        n = sum(p.numel() for p in model.parameters())
        flops = a.ranks * B * T * (6 * n + 6 * L * C * T)
        out.put(f"config={a.config} torch={torch.__version__} ddp=gloo ranks={a.ranks} threads/rank={a.threads} "
                f"B={B} T={T} params={n / 1e6:.2f}M | median step {med * 1e3:.1f} ms | "
                f"{a.ranks * B * T / med:.0f} tokens/s | {flops / med / 1e9:.1f} GFLOP/s")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tiny", choices=CONFIGS)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--steps", type=int, default=12, help="steps including 2 warm-up steps")
    ap.add_argument("--micro-batch", type=int, default=0, help="per-rank B (0: the config's)")
    ap.add_argument("--seq-len", type=int, default=0, help="T (0: the config's)")
    a = ap.parse_args()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(worker, args=(a, port, out), nprocs=a.ranks, join=True)
    print(out.get())


if __name__ == "__main__":
    main()
