"""The Hugging Face side of the tests/e2e/hf_*.sh tests (run with scripts/hf-venv.sh's python).

Subcommands:
  tok-train TEXT OUT VOCAB          train a byte-level BPE tokenizer.json with `tokenizers`
  tok-text OUT REPEAT               write the test text: Unicode, emoji, numbers, whitespace runs, empty lines
  tok-compare TOKJSON DATADIR FILE..  ids of shardgpt's prepare == [eot] + tokenizers' ids per file
                                    ([eot] where the tokenizer has <|endoftext|>, else the
                                    post-processor template's prefix, e.g. <|begin_of_text|>)
  tok-train-llama3 TEXT OUT VOCAB   train a Llama 3-style tokenizer.json (Split regex + ByteLevel
                                    without regex, ignore_merges, <|begin_of_text|> template) and
                                    add whole words to its vocabulary that merges do not reach
  tok-text-llama3 OUT REPEAT SEED   tok-text's text plus code, digit runs, contractions, special
                                    tokens, and a seeded random mix of such pieces
(tok-train-llama3 and its comparisons need tokenizers >= 0.19: scripts/tokenizers-venv.sh)
  hf-check DIR DATA T B K EVALJSON LOGITS  transformers' loss / first-batch logits == shardgpt eval's
  hf-random DIR SEED                save_pretrained a random GPT2LMHeadModel (L2 H4 C64 T64 V300)
  llama-random DIR SEED [SHARD]     save_pretrained a random LlamaForCausalLM (L2 H8 KV2 C64 F160 T64 V300,
                                    rope_theta 500000, untied; SHARD: max_shard_size, e.g. 100KB)
(hf-check and step-loss load GPT2LMHeadModel or LlamaForCausalLM by config.json's model_type)
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
    prefix = tok.encode("", add_special_tokens=True).ids  # the template's (<|begin_of_text|>), without <|endoftext|>
    want = []
    for f in files:
        text = open(f, encoding="utf-8", newline="").read()
        enc = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(enc, skip_special_tokens=False) == text, "tokenizers itself does not round-trip " + f
        want += ([eot] if eot is not None else prefix) + enc
    got = read_shard(os.path.join(datadir, "train.bin")).tolist()
    if os.path.exists(os.path.join(datadir, "val.bin")):
        got += read_shard(os.path.join(datadir, "val.bin")).tolist()
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            raise SystemExit("first difference at token %d: tokenizers %s, shardgpt %s" % (i, want[i:i + 8], got[i:i + 8]))
    assert len(want) == len(got), (len(want), len(got))
    print("ids identical to tokenizers': %d tokens from %d file(s)" % (len(got), len(files)))


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|reserved_special_token_0|>"]
# pre-tokens added to the vocabulary as whole words after training (Llama 3's vocabulary holds
# words its merges do not build): with ignore_merges each is one id
LLAMA3_WHOLE_WORDS = [" Hello", " world", "Numbers", " agree", " unsigned", "    ", "\t\t", " {\n", "123",
                      " \u4e2d\u6587", "'LL", " def"]


def tok_train_llama3(text, out, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([text], trainer)
    j = json.loads(tok.to_str())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    v = j["model"]["vocab"]
    for w in LLAMA3_WHOLE_WORDS:
        sym = "".join(p for p, _ in byte_level.pre_tokenize_str(w))
        if sym not in v:
            v[sym] = len(v)
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens(LLAMA3_SPECIALS)  # ids after the vocabulary's, as Llama 3's
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(out)
    # the words whose ids ignore_merges decides: most of them, or the test would not test it
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = False
    merged = Tokenizer.from_str(json.dumps(j))
    changed = [w for w in LLAMA3_WHOLE_WORDS
               if tok.encode(w, add_special_tokens=False).ids != merged.encode(w, add_special_tokens=False).ids]
    assert len(changed) >= 8, changed
    assert tok.encode("x").ids[0] == bos
    print("Llama 3-style tokenizer: %d ids; ignore_merges decides the ids of %d words" % (tok.get_vocab_size(), len(changed)))


def tok_text_llama3(out, repeat, seed):
    import random
    tok_text(out, 1)
    parts = [open(out, encoding="utf-8", newline="").read(),
             "#include <stdio.h>\nint main(void) {\n\tint x = 12345678901234567890;\n    if (x != 0) {\n"
             "\t\tprintf(\"%d\\n\", x);\n    }\n}\n",
             "def f(a, b):\r\n    '''Doc.'''\r\n    return a  +  b\r\n\r\n\tclass C:\n        pass\n",
             "Digits 1 12 123 1234 12345 123456 1234567 0.5 3,141,592 \u0661\u0662\u0663\u0664 \uff11\uff12\uff13\uff14 2026\n",
             "I'LL DON'T don't We'Re you'VE she'D it'S '\u017f O'Neil rock'n'roll ''quoted''\n",
             "\u4e2d\u6587 \u4e2d\u6587\u6587\u672c\u3002\u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4\n",
             "Emoji \U0001F600\U0001F600 a\U0001F44D\U0001F3FDb \U0001F1EB\U0001F1F7\n",
             "spaces     \n\n\n   \t\t  x  \r\n\r\n\u00a0\u00a0y\u0085z\u3000\u3000w   \n",
             "<|begin_of_text|>Hi<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|><|reserved_special_token_0|>\n",
             "Hello world Numbers agree unsigned def {\n    x\n}\n"]
    pieces = ["a", "Z", "the", " The", "'s", "'LL", "'", "1", "22", "4444", " ", "  ", "\t", "\n", "\r\n", "\r", "!", "?!",
              "...", "{", "}", "(", ")", "_", "-", "\u00e9", "e\u0301", "\u4e2d", "\U0001F600", "\u00a0", "\u0085", "\u3000",
              "\u0661", "<|eot_id|>", "\u00df", "\u017f", " Hello", "    "]
    rng = random.Random(int(seed))
    mix = "".join(rng.choice(pieces) for _ in range(20000))
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write(("".join(parts) + mix + "\n") * int(repeat))


def model_class(d):
    import transformers
    mt = json.load(open(d + "/config.json"))["model_type"]
    return {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM}[mt]


def hf_check(d, data, T, B, K, eval_json, logits):
    import torch
    T, B, K = int(T), int(B), int(K)
    model, info = model_class(d).from_pretrained(d, output_loading_info=True)
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


def llama_random(d, seed, shard=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(int(seed))
    cfg = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, max_position_embeddings=64, vocab_size=300, rms_norm_eps=1e-5,
                      rope_theta=500000.0, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # RMSNorm weights off their init of 1 too, so a wrong mapping shows
        for _, p in m.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    if shard:
        m.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    else:
        m.save_pretrained(d, safe_serialization=True)


def step_loss(d, data, T, nwin, log):
    import torch
    T, nwin = int(T), int(nwin)
    m = model_class(d).from_pretrained(d).eval()
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
    cmds = {"tok-train": tok_train, "tok-text": tok_text, "tok-compare": tok_compare, "tok-train-llama3": tok_train_llama3,
            "tok-text-llama3": tok_text_llama3, "hf-check": hf_check,
            "hf-random": hf_random, "llama-random": llama_random, "step-loss": step_loss}
    cmds[sys.argv[1]](*sys.argv[2:])
