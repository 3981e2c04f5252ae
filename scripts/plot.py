#!/usr/bin/python3
"""Loss curves from shardgpt's JSONL logs (train --log): train and validation loss against
optimizer step (left) and against tokens seen (right), one colour per log, into a PNG.
With --trace, a Gantt chart of a merged timeline instead (train --trace, then shardgpt
diagnose --merge-trace): one row per rank, its phases coloured by kind, its collectives as a
thinner bar below them.

  scripts/plot.py -o curves.png runs/a.jsonl runs/b.jsonl [--label A --label B] [--title T]
  scripts/plot.py -o timeline.png --trace DIR/trace_merged.json [--title T]

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


PHASE_COLOURS = {"data": "C7", "forward": "C0", "backward": "C1", "grad_sync": "C3", "optimizer": "C2",
                 "checkpoint": "C5", "validation": "C4", "idle": "0.85", "setup": "0.6"}


def read_trace(path):
    """The complete events ("ph": "X") of a merged trace by rank: (phases, collectives), each a
    list of (start ms, duration ms, name)."""
    try:
        with open(path) as f:
            j = json.load(f)
    except json.JSONDecodeError as e:
        sys.exit(f"plot.py: error: {path}: not a complete trace ({e.msg})")
    if not isinstance(j, dict) or not isinstance(j.get("traceEvents"), list):
        sys.exit(f"plot.py: error: {path}: not a Chrome trace (no traceEvents)")
    ranks = {}
    for e in j["traceEvents"]:
        if e.get("ph") != "X":
            continue
        phases, colls = ranks.setdefault(e.get("pid", 0), ([], []))
        span = (e["ts"] / 1e3, e.get("dur", 0) / 1e3, e.get("name", ""))
        (phases if e.get("cat") == "phase" else colls).append(span)
    if not ranks:
        sys.exit(f"plot.py: error: {path}: no spans (expected the output of shardgpt diagnose --merge-trace)")
    return ranks, j.get("otherData", {})


def plot_trace(a, plt):
    ranks, other = read_trace(a.trace)
    origin = min(s[0] for phases, colls in ranks.values() for s in phases + colls)
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.7 * len(ranks)))
    seen = set()
    for row, rank in enumerate(sorted(ranks)):
        phases, colls = ranks[rank]
        y = len(ranks) - 1 - row  # rank 0 on top
        for start, dur, name in phases:
            kind = name.split(" ")[0]
            ax.broken_barh([(start - origin, dur)], (y + 0.3, 0.6), color=PHASE_COLOURS.get(kind, "0.5"),
                           label=kind if kind not in seen else None)
            seen.add(kind)
        if colls:
            ax.broken_barh([(s - origin, d) for s, d, _ in colls], (y + 0.05, 0.2), color="k",
                           label="collectives" if "collectives" not in seen else None)
            seen.add("collectives")
    ax.set_yticks([len(ranks) - 1 - i + 0.5 for i in range(len(ranks))])
    ax.set_yticklabels([f"rank {r}" for r in sorted(ranks)])
    ax.set_xlabel("time (ms)")
    steps = other.get("steps")
    title = a.title if a.title != DEFAULT_TITLE else "shardgpt timeline" + (f", steps {steps[0]}-{steps[1]}" if steps else "")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(a.output, dpi=90)
    print(f"plot.py: wrote {a.output}")
    return 0


DEFAULT_TITLE = "shardgpt loss curves"


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
    ap.add_argument("logs", nargs="*", help="JSONL logs of shardgpt train --log")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--label", action="append", default=[], help="legend label per log (default: file name)")
    ap.add_argument("--title", default=DEFAULT_TITLE)
    ap.add_argument("--trace", help="a merged trace (shardgpt diagnose --merge-trace): draw its Gantt chart instead")
    ap.add_argument("--smooth", type=int, default=20, help="moving average of the train loss, in steps")
    a = ap.parse_args()
    if bool(a.trace) == bool(a.logs):
        sys.exit("plot.py: error: give JSONL logs, or --trace with a merged trace (not both)")
    if a.label and len(a.label) != len(a.logs):
        sys.exit(f"plot.py: error: --label given {len(a.label)} time(s) for {len(a.logs)} log(s)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 2
    if a.trace:
        return plot_trace(a, plt)
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
