"""PNG figures for perf reports (matplotlib, Agg backend: no display needed).

- `plot_width_sweep`: gain over the chain vs budget N, one line per domain (paper Fig. 3),
  with the gain of `cast:auto` drawn as a level per domain when given.
- `plot_accept_histograms`: committed round length R per method.
- `plot_acceptance_report`: drafter replay R per budget per domain, and depth-1 reliability.
- `plot_training_curve`: drafter training loss and validation tau against wall time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402


def save_figure(fig: plt.Figure, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120, format="png")
    plt.close(fig)
    return out


def plot_width_sweep(
    gains: Mapping[str, Mapping[int, float]],  # domain -> {budget N: gain over chain (fraction)}
    out: str | Path,
    auto_gain: Mapping[str, float] | None = None,  # domain -> gain of cast:auto (fraction)
    title: str = "Width sweep: gain over the chain vs budget N",
) -> Path:
    if not gains:
        raise ValueError("plot_width_sweep needs at least one domain")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for domain, by_n in gains.items():
        n = sorted(by_n)
        line, = ax.plot(n, [100 * by_n[k] for k in n], marker="o", label=domain)
        if auto_gain and domain in auto_gain:  # auto mixes widths and undrafted rounds: a level, not an N
            ax.axhline(100 * auto_gain[domain], color=line.get_color(), linestyle="--", linewidth=1)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree budget N (nonroot nodes); dashed: cast:auto of the same colour")
    ax.set_ylabel("gain over chain (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def plot_accept_histograms(
    accept_lengths: Mapping[str, Sequence[int]],  # method label -> committed R of every round
    out: str | Path,
) -> Path:
    if not accept_lengths:
        raise ValueError("plot_accept_histograms needs at least one method")
    labels = list(accept_lengths)
    top = max((max(v) for v in accept_lengths.values() if len(v)), default=1)
    bins = np.arange(1, top + 2) - 0.5
    fig, axes = plt.subplots(len(labels), 1, figsize=(6.4, 1.6 * len(labels) + 0.6), sharex=True, squeeze=False)
    for ax, label in zip(axes[:, 0], labels):
        values = np.asarray(accept_lengths[label])
        ax.hist(values, bins=bins, density=True)
        mean = values.mean() if len(values) else 0.0
        ax.set_title(f"{label}: mean R = {mean:.2f} over {len(values)} rounds", fontsize=9)
        ax.set_ylabel("share")
    axes[-1, 0].set_xlabel("committed round length R = accepted + 1")
    return save_figure(fig, out)


def plot_acceptance_report(report: Mapping[str, Mapping], out: str | Path) -> Path:
    """Left: replayed committed length R vs CAST budget per domain, the chain dashed.
    Right: depth-1 reliability (mean drafter score vs hit rate per bin; paper Fig. 4b)."""
    if not report:
        raise ValueError("plot_acceptance_report needs at least one domain")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (name, row) in enumerate(report.items()):
        color = f"C{i}"
        budgets = sorted(int(k.split(":")[1]) for k in row if k.startswith("cast:"))
        left.plot(budgets, [row[f"cast:{n}"]["R"] for n in budgets], "o-", color=color, label=f"{name} CAST")
        left.axhline(row["chain"]["R"], color=color, linestyle="--", label=f"{name} chain")
        bins = row["depth1_reliability"]["bins"]
        right.plot([b["mean_score"] for b in bins], [b["hit_rate"] for b in bins], "o-", color=color, label=name)
    left.set_xscale("log", base=2)
    left.set_xlabel("CAST budget N (non-root nodes)")
    left.set_ylabel("committed round length R")
    left.set_title("Greedy replay on held-out prompts")
    left.legend(fontsize=7)
    right.plot([0, 1], [0, 1], color="gray", linewidth=0.8)
    right.set_xlabel("drafter score (depth 1)")
    right.set_ylabel("hit rate")
    right.set_title("Depth-1 reliability")
    right.legend(fontsize=7)
    return save_figure(fig, out)


def plot_training_curve(record: Mapping, out: str | Path) -> Path:
    """Loss (left axis) and validation tau (right axis) against training minutes, from a
    drafter's `training.json` (`loss_curve`, `validation_tau`)."""
    loss, evals = record.get("loss_curve") or [], record.get("validation_tau") or []
    if not loss:
        raise ValueError("plot_training_curve needs a non-empty loss_curve")
    fig, left = plt.subplots(figsize=(7, 4))
    left.plot([e["seconds"] / 60 for e in loss], [e["loss"] for e in loss], color="C0", linewidth=1)
    left.set_xlabel("training time (minutes)")
    left.set_yscale("log")  # the first steps (~ln V) would flatten the rest
    left.set_ylabel("weighted block cross-entropy", color="C0")
    right = left.twinx()
    runs = sorted({e.get("run", -1) for e in evals})  # evals before runs were recorded: -1
    for i, run in enumerate(runs):  # one line per run: a resumed run may validate on other shards
        part = [e for e in evals if e.get("run", -1) == run]
        right.plot([e["seconds"] / 60 for e in part], [e["tau"] for e in part], "o-", color=f"C{1 + i}",
                   label=f"validation tau, run {i + 1}")
    for run in (record.get("runs") or [])[0 if -1 in runs else 1 :]:
        left.axvline(run["seconds"] / 60, color="grey", linestyle=":", linewidth=1)
    right.set_ylabel("validation tau (accepted chain length)")
    if len(runs) > 1:
        right.legend(loc="lower right", fontsize=8)
    left.set_title("DFlash head training on CPU (dotted: a resumed run starts)")
    return save_figure(fig, out)


def plot_learning_curve(points: Sequence[Mapping], out: str | Path, targets: Mapping[str, float] | None = None,
                        budget: str = "cast:15") -> Path:
    """Replayed R against training minutes per domain: chain solid, CAST at `budget`
    dashed, the chain target (when given) dotted. points: {"minutes", "domains": report}."""
    if not points:
        raise ValueError("plot_learning_curve needs at least one report")
    points = sorted(points, key=lambda p: p["minutes"])
    fig, ax = plt.subplots(figsize=(7, 4.6))
    minutes = [p["minutes"] for p in points]
    for i, name in enumerate(points[0]["domains"]):
        color = f"C{i}"
        ax.plot(minutes, [p["domains"][name]["chain"]["R"] for p in points], "o-", color=color, label=f"{name} chain")
        ax.plot(minutes, [p["domains"][name][budget]["R"] for p in points], "s--", color=color,
                label=f"{name} CAST {budget.split(':')[1]}")
        if targets and name in targets:
            ax.axhline(targets[name], color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("training time (minutes, 2 CPU cores)")
    ax.set_ylabel("committed round length R (held-out replay)")
    ax.set_title("Learning curve of the DFlash head (dotted: chain targets)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: the curves reach the top
    return save_figure(fig, out)
