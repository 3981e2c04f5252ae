"""The Hugging Face side of the tests/e2e/hf_*.sh tests (run with scripts/hf-venv.sh's python).

Subcommands:
  tok-train TEXT OUT VOCAB          train a byte-level BPE tokenizer.json with `tokenizers`
  tok-text OUT REPEAT               write the test text: Unicode, emoji, numbers, whitespace runs, empty lines
  tok-compare TOKJSON DATADIR FILE..  ids of shardgpt's prepare == [eot] + tokenizers' ids per file
  hf-check DIR DATA T B K EVALJSON LOGITS  transformers' loss / first-batch logits == shardgpt eval's
  hf-random DIR SEED                save_pretrained a random GPT2LMHeadModel (L2 H4 C64 T64 V300)
  step-loss DIR DATA T NWIN LOG     PyTorch's loss on the first NWIN windows == the JSONL's step-1 loss
"""
import json
import sys

import numpy as np


def read_shard(path):
    h = np.fromfile(path, dtype=np.int32, count=256)
    assert h[0] == 20240520 and h[1] == 1, h[:3]
    return np.fromfile(path, dtype=np.uint16, offset=1024)[: h[2]].astype(np.int64)


def tok_train(text, out, vocab):
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train([text], vocab_size=int(vocab), min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save(out)


def tok_text(out, repeat):
    parts = ["Hello world! It's a test; they're here, we've done it, I'm sure you'll agree, he'd say.\n", "\n\n\n",
             "Numbers: 3.14159 and 1,000,000 and \u0661\u0662\u0663 and \u2167 2026-12-02.\n",
             "   leading spaces\tand\ttabs   \n", "trailing spaces     \n", "\r\nCRLF line\r\n",
             "Emoji: \U0001F600\U0001F389\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 flags \U0001F1EB\U0001F1F7\n",
             "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\ud55c\uad6d\uc5b4.\n",
             "\u00dcn\u00efc\u00f6d\u00e9 \u00e7\u00e5f\u00e9 na\u00efve \u2014 \u201cquotes\u201d \u2018single\u2019 \u2026 \u00abguillemets\u00bb\n",
             "NBSP\u00a0here, NEL\u0085there,\u2028LS and\u3000ideographic space\n",
             "combining e\u0301 and a\u0308\n", "<|endoftext|>inline special<|endoftext|>\n", "    \n  \n\t\n",
             "x" * 50 + "\n", "'s 't 're 've 'm 'll 'd 'S\n", "!!!???...---___\n", "  end"]
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(parts) * int(repeat))


def tok_compare(tokjson, datadir, *files):
    import os
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokjson)
    eot = tok.token_to_id("<|endoftext|>")
    want = []
    for f in files:
        text = open(f, encoding="utf-8", newline="").read()
        enc = tok.encode(text).ids
        assert tok.decode(enc, skip_special_tokens=False) == text, "tokenizers itself does not round-trip " + f
        want += [eot] + enc
    got = read_shard(os.path.join(datadir, "train.bin")).tolist()
    if os.path.exists(os.path.join(datadir, "val.bin")):
        got += read_shard(os.path.join(datadir, "val.bin")).tolist()
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            raise SystemExit("first difference at token %d: tokenizers %s, shardgpt %s" % (i, want[i:i + 8], got[i:i + 8]))
    assert len(want) == len(got), (len(want), len(got))
    print("ids identical to tokenizers': %d tokens from %d file(s)" % (len(got), len(files)))


def hf_check(d, data, T, B, K, eval_json, logits):
    import torch
    from transformers import GPT2LMHeadModel
    T, B, K = int(T), int(B), int(K)
    model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    model.eval()
    tok = read_shard(data)
    S = (len(tok) - 1) // T
    W = min(S, K * B) if K > 0 else S
    total, n, first = 0.0, 0, None
    with torch.no_grad():
        for b0 in range(0, W, B):
            idx = range(b0, min(b0 + B, W))
            x = torch.tensor(np.stack([tok[k * T: k * T + T] for k in idx]))
            y = torch.tensor(np.stack([tok[k * T + 1: k * T + T + 1] for k in idx]))
            lg = model(x).logits
            if first is None:
                first = lg.numpy()
            total += torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1),
                                                       reduction="sum").double().item()
            n += y.numel()
    ref = total / n
    ours = json.loads(eval_json)
    assert ours["tokens"] == n, (ours, n)
    assert abs(ours["perplexity"] - np.exp(ours["loss"])) <= 1e-6 * ours["perplexity"], ours
    print("transformers loss %.7f, shardgpt eval %.7f, |diff| %.2e" % (ref, ours["loss"], abs(ref - ours["loss"])))
    assert abs(ref - ours["loss"]) <= 1e-5, (ref, ours)
    got = np.fromfile(logits, dtype=np.float32).reshape(first.shape)
    md = float(np.abs(got - first).max())
    print("logits of the first micro-batch %s: max |diff| %.2e" % (first.shape, md))
    assert md <= 1e-4, md


def hf_random(d, seed):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(int(seed))
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=300, activation_function="gelu_new",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # LayerNorms and biases off their 1/0 init too, so a wrong mapping shows
        for _, p in m.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    m.save_pretrained(d, safe_serialization=True)


def step_loss(d, data, T, nwin, log):
    import torch
    from transformers import GPT2LMHeadModel
    T, nwin = int(T), int(nwin)
    m = GPT2LMHeadModel.from_pretrained(d).eval()
    tok = read_shard(data)
    x = torch.tensor(np.stack([tok[k * T: k * T + T] for k in range(nwin)]))
    y = torch.tensor(np.stack([tok[k * T + 1: k * T + T + 1] for k in range(nwin)]))
    with torch.no_grad():
        lg = m(x).logits
        ref = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()
    ours = json.loads(open(log).readline())["loss"]
    print("step 1 loss: PyTorch %.7f, shardgpt %.7f, |diff| %.2e" % (ref, ours, abs(ref - ours)))
    assert abs(ref - ours) <= 1e-5, (ref, ours)


if __name__ == "__main__":
    cmds = {"tok-train": tok_train, "tok-text": tok_text, "tok-compare": tok_compare, "hf-check": hf_check,
            "hf-random": hf_random, "step-loss": step_loss}
    cmds[sys.argv[1]](*sys.argv[2:])
