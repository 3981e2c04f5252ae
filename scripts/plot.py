#!/usr/bin/python3
"""Loss curves from shardgpt's JSONL logs (train --log): train and validation loss against
optimizer step (left) and against tokens seen (right), one colour per log, into a PNG.

  scripts/plot.py -o curves.png runs/a.jsonl runs/b.jsonl [--label A --label B] [--title T]

Each log line is one step: "step", "tokens", "loss" (train, this step's global batch) and, on
validation steps, "val_loss". Train losses are drawn thin (with a moving average of --smooth
steps drawn over them), validation losses as markers joined by lines. Needs matplotlib
(Debian: apt-get install python3-matplotlib); without it, says so and exits 2.
"""
import argparse
import json
import sys


def read_log(path):
    steps, tokens, loss, vsteps, vtokens, vloss = [], [], [], [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot.py: error: {path}:{n}: not JSON ({e.msg})")
            if "step" not in j or "loss" not in j:
                continue  # not a step line
            steps.append(j["step"])
            tokens.append(j.get("tokens", 0))
            loss.append(j["loss"])
            if "val_loss" in j and j["val_loss"] is not None:
                vsteps.append(j["step"])
                vtokens.append(j.get("tokens", 0))
                vloss.append(j["val_loss"])
    if not steps:
        sys.exit(f"plot.py: error: {path}: no step lines (expected the JSONL of shardgpt train --log)")
    return steps, tokens, loss, vsteps, vtokens, vloss


def smooth(values, k):
    if k <= 1:
        return values
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="JSONL logs of shardgpt train --log")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--label", action="append", default=[], help="legend label per log (default: file name)")
    ap.add_argument("--title", default="shardgpt loss curves")
    ap.add_argument("--smooth", type=int, default=20, help="moving average of the train loss, in steps")
    a = ap.parse_args()
    if a.label and len(a.label) != len(a.logs):
        sys.exit(f"plot.py: error: --label given {len(a.label)} time(s) for {len(a.logs)} log(s)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 2
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, path in enumerate(a.logs):
        steps, tokens, loss, vsteps, vtokens, vloss = read_log(path)
        label = a.label[i] if a.label else path.rsplit("/", 1)[-1]
        colour = f"C{i}"
        for ax, x, vx in ((axes[0], steps, vsteps), (axes[1], tokens, vtokens)):
            ax.plot(x, loss, color=colour, alpha=0.25, linewidth=0.7)
            ax.plot(x, smooth(loss, a.smooth), color=colour, linewidth=1.3, label=f"{label} train")
            if vloss:
                ax.plot(vx, vloss, color=colour, linestyle="--", marker="o", markersize=3, label=f"{label} val")
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("tokens")
    axes[0].set_ylabel("loss (nats/token)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=90)
    print(f"plot.py: wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
