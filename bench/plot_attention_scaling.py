"""Plots bench/attention_scaling.sh's JSON lines: time and peak memory against length."""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


# An op and the whole model built on it share a colour (op solid, model dashed).
FAMILY = {
    "softmax": "softmax", "model:sasrec": "softmax",
    "linrec": "linrec", "model:linrec": "linrec",
    "lightsans": "lightsans", "model:lightsans": "lightsans",
    "lisa": "lisa", "lisa:reference": "lisa", "model:lisa": "lisa",
    "routing": "routing", "model:routing": "routing",
    "gated:softmax": "flash4rec", "model:flash4rec": "flash4rec",
    "gated:cosine": "flash4rec:cosine", "model:flash4rec:cosine": "flash4rec:cosine",
}


def main(src: str, dst: str) -> None:
    series = defaultdict(list)
    for line in open(src):
        if line.strip():
            r = json.loads(line)
            series[r["op"]].append((r["len"], r["ms"], r["peak_mb"]))
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6))
    families = sorted({FAMILY.get(op, op) for op in series})
    colour = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(families)}
    for op, pts in sorted(series.items()):
        pts.sort()
        model = op.startswith("model:")
        kw = dict(linestyle="--" if model else "-", marker="s" if model else "o", markersize=4,
                  color=colour[FAMILY.get(op, op)], label=op)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], **kw)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], **kw)
    for ax, what in zip(axes, ["forward+backward (ms)", "peak memory above inputs (MB)"]):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (fixed token count)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, title="op (solid) / model (dashed)",
               title_fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
