"""Goodput tables and plot (`perf.goodput` writes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def format_goodput(cells: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    head = ["B", "policy", "budget per round", "goodput tok/s", "vs chain", "mean R",
            "packed/round", "packed/req-round", "rounds", "decode s", "= chain"]
    body = [[str(c["batch_size"]), c["policy"], c["budget"], f"{c['goodput_tok_s']:.1f}",
             "-" if c["ratio_to_chain"] is None else f"{c['ratio_to_chain']:.2f}x",
             "-" if c["mean_R"] is None else f"{c['mean_R']:.2f}",
             "-" if c["mean_packed_per_round"] is None else f"{c['mean_packed_per_round']:.1f}",
             "-" if c["mean_packed_per_request_round"] is None else f"{c['mean_packed_per_request_round']:.1f}",
             str(c["rounds"]), f"{c['decode_s']:.2f}", "yes" if c["equal_to_chain"] else "NO"] for c in cells]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(row) for row in body])


def plot_goodput(cells: Sequence[dict[str, Any]], out: str | Path) -> Path:
    """Goodput vs B, one line per policy (paper Fig. 7)."""
    from perf.plots import save_figure  # first: it selects the Agg backend

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(c["policy"] for c in cells):
        mine = [c for c in cells if c["policy"] == name]
        ax.plot([c["batch_size"] for c in mine], [c["goodput_tok_s"] for c in mine], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B (concurrent requests)")
    ax.set_ylabel("goodput (committed tokens / decode s)")
    ax.set_title("Goodput under load by allocation policy")
    ax.legend()
    return save_figure(fig, out)
