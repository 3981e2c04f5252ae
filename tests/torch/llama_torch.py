#!/usr/bin/python3
"""Repeats tests/torch/llama_ref.cc's run in PyTorch and checks every step's loss.

The model is written here from the Llama definition (as transformers' LlamaForCausalLM computes
it: RMSNorm in fp32, rotate-half rotary embeddings with inv_freq = 1 / theta^(2i/hs) in fp32,
key/value heads repeated for their groups, SwiGLU, no biases), not from shardgpt's kernels; the
initial parameters, token ids and AdamW settings come from the reference run's files.
  llama_torch.py DIR   (exit 0: every loss within 1e-5 relative; 1: a mismatch)
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
flat = np.fromfile(d + "/init.f32", dtype=np.float32)
L, NH, KV, C = meta["n_layer"], meta["n_head"], meta["n_kv_head"], meta["n_embd"]
V, B, T, hs = meta["vocab_size"], meta["B"], meta["T"], C // meta["n_head"]
params = {}
for t in meta["tensors"]:
    n = int(np.prod(t["shape"]))
    params[t["name"]] = torch.tensor(flat[t["offset"]:t["offset"] + n].reshape(t["shape"]), requires_grad=True)
decay = [params[t["name"]] for t in meta["tensors"] if t["decay"]]
no_decay = [params[t["name"]] for t in meta["tensors"] if not t["decay"]]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": meta["weight_decay"]},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=meta["lr"], betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"])


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + meta["norm_eps"]) * w


def rope(x):  # x [B, H, T, hs]
    inv_freq = 1.0 / (meta["rope_theta"] ** (torch.arange(0, hs, 2).float() / hs))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rot = torch.cat((-x[..., hs // 2:], x[..., :hs // 2]), dim=-1)
    return x * cos + rot * sin


def forward(idx, tgt):
    x = params["embed_tokens.weight"][idx]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(L):
        p = lambda n: params["layers.%d.%s.weight" % (l, n)]
        h = rmsnorm(x, p("input_layernorm"))
        q = (h @ p("self_attn.q_proj").t()).view(B, T, NH, hs).transpose(1, 2)
        k = (h @ p("self_attn.k_proj").t()).view(B, T, KV, hs).transpose(1, 2)
        v = (h @ p("self_attn.v_proj").t()).view(B, T, KV, hs).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(NH // KV, dim=1), v.repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, C) @ p("self_attn.o_proj").t()
        h = rmsnorm(x, p("post_attention_layernorm"))
        x = x + (F.silu(h @ p("mlp.gate_proj").t()) * (h @ p("mlp.up_proj").t())) @ p("mlp.down_proj").t()
    head = params["embed_tokens.weight"] if meta["tied"] else params["lm_head.weight"]
    logits = rmsnorm(x, params["norm.weight"]) @ head.t()
    return F.cross_entropy(logits[..., :V].reshape(-1, V), tgt.reshape(-1))


tokens = np.fromfile(d + "/tokens.i32", dtype=np.int32).reshape(meta["steps"], 2, B, T)
worst = 0.0
for s in range(meta["steps"]):
    opt.zero_grad()
    loss = forward(torch.tensor(tokens[s, 0]).long(), torch.tensor(tokens[s, 1]).long())
    loss.backward()
    opt.step()
    ours = meta["losses"][s]
    rel = abs(loss.item() - ours) / abs(loss.item())
    worst = max(worst, rel)
    print("step %d: torch %.7f shardgpt %.7f rel %.2e" % (s + 1, loss.item(), ours, rel))
if meta["losses"][-1] >= meta["losses"][0]:
    print("FAIL: the reference run's loss did not fall")
    sys.exit(1)
print(("FAIL" if worst > 1e-5 else "ok") + ": worst relative loss difference %.2e (limit 1e-5)" % worst)
sys.exit(1 if worst > 1e-5 else 0)
