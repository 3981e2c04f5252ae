#!/usr/bin/python3
"""PyTorch peer of bench_train: the same GPT-2 model, configs and step (forward, backward,
clip, AdamW) on synthetic tokens, printing the median step's tokens/s in bench_train's format.

Bench only (Debian's python3-torch for /usr/bin/python3); never a test or CI dependency.
  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_train.py --config tiny --dtype bf16 --threads 2
--dtype bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) with fp32
parameters and AdamW (PyTorch's CPU mixed precision: matmuls in bf16 through oneDNN where the
CPU supports it).
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # name: (L, H, C, V, maxT, B, T) -- bench/bench_train.cc's configs
    "tiny": (4, 4, 256, 256, 256, 8, 256),
    "small": (6, 6, 384, 256, 256, 8, 256),
    "gpt2": (12, 12, 768, 50257, 1024, 4, 64),
}


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, V, maxT):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", torch.triu(torch.ones(maxT, maxT, dtype=torch.bool), 1))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tiny", choices=CONFIGS)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="steps including 2 warm-up steps")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop measuring after this long (at least one measured step; 0: no limit)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    L, H, C, V, maxT, B, T = CONFIGS[a.config]
    model = GPT(L, H, C, V, maxT)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    start = time.perf_counter()
    for s in range(a.steps):
        x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s >= 2:  # skip warm-up, as bench_train does
            times.append(time.perf_counter() - t0)
            if a.max_seconds > 0 and time.perf_counter() - start > a.max_seconds:
                break
    times.sort()
    med = times[len(times) // 2]
    n = sum(p.numel() for p in model.parameters())
    flops = B * T * (6 * n + 6 * L * C * T)
    print(f"config={a.config} torch={torch.__version__} dtype={a.dtype} threads={a.threads} B={B} T={T} "
          f"params={n / 1e6:.2f}M | median step {med * 1e3:.1f} ms | {B * T / med:.0f} tokens/s | "
          f"{flops / med / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
