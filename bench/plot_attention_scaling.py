"""Plots bench/attention_scaling.sh's JSON lines: time and peak memory against length."""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    series = defaultdict(list)
    for line in open(src):
        if line.strip():
            r = json.loads(line)
            series[r["op"]].append((r["len"], r["ms"], r["peak_mb"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for op, pts in sorted(series.items()):
        pts.sort()
        style = "--" if op.startswith("model:") else "-"
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=op)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], style, marker="o", label=op)
    for ax, what in zip(axes, ["forward+backward (ms)", "peak memory above inputs (MB)"]):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (fixed token count)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
