#!/usr/bin/python3
"""PyTorch peer of bench_train: the same GPT-2 and Llama models, configs and step (forward,
backward, clip, AdamW) on synthetic tokens, printing the median step's tokens/s in bench_train's
format.

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
LLAMA_CONFIGS = {  # name: (L, H, KV, C, F, V, B, T) -- bench_train's --arch llama configs (untied head)
    "llama": (12, 12, 4, 768, 2048, 50257, 1, 256),
    "llama-small": (6, 6, 2, 384, 1024, 256, 8, 256),
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


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(C))

    def forward(self, x):  # in fp32, as transformers' LlamaRMSNorm
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, q|k|v in one bias-free matmul (as shardgpt's packed q|k|v), rotate-half RoPE on q
    and k, kv heads repeated by repeat_interleave, causal attention, o_proj; RMSNorm, gate|up in
    one matmul, silu(gate) * up, down_proj."""

    def __init__(self, C, H, KV, F_):
        super().__init__()
        self.H, self.KV, self.hs, self.F = H, KV, C // H, F_
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
        self.qkv_proj = nn.Linear(C, (H + 2 * KV) * self.hs, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        self.gate_up_proj = nn.Linear(C, 2 * F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        H, KV, hs = self.H, self.KV, self.hs
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split([H * hs, KV * hs, KV * hs], dim=2)
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, KV, hs).transpose(1, 2)
        v = v.view(B, T, KV, hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o_proj(y)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).split(self.F, dim=2)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, H, KV, C, F_, V, maxT, theta=10000.0):
        super().__init__()
        hs = C // H
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(LlamaBlock(C, H, KV, F_) for _ in range(L))
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied
        self.register_buffer("mask", torch.triu(torch.ones(maxT, maxT, dtype=torch.bool), 1))
        inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2).float() / hs))
        emb = torch.outer(torch.arange(maxT).float(), inv_freq).repeat(1, 2)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            x = b(x, self.mask, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tiny", choices=list(CONFIGS) + list(LLAMA_CONFIGS))
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="steps including 2 warm-up steps")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop measuring after this long (at least one measured step; 0: no limit)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    if a.config in LLAMA_CONFIGS:
        L, H, KV, C, F_, V, B, T = LLAMA_CONFIGS[a.config]
        model = Llama(L, H, KV, C, F_, V, T)
    else:
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
    if a.config in LLAMA_CONFIGS:  # bench_train's llama count: 3 x GPT::ForwardFlops (no embedding lookup)
        hs, Vp = C // H, (V + 127) // 128 * 128
        flops = B * T * 3 * (L * 2 * (C * (H + 2 * KV) * hs + C * C + 3 * C * F_ + T * C) + 2 * C * Vp)
    else:
        flops = B * T * (6 * n + 6 * L * C * T)
    print(f"config={a.config} torch={torch.__version__} dtype={a.dtype} threads={a.threads} B={B} T={T} "
          f"params={n / 1e6:.2f}M | median step {med * 1e3:.1f} ms | {B * T / med:.0f} tokens/s | "
          f"{flops / med / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
