"""Learning-curve plots from run folders' `metrics.csv`."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

CURVES = ("charts/episodic_return", "eval/return_mean")


def read_metrics(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """Every metric's (steps, values) from a run folder's `metrics.csv`; of a run still going, the rows
    written so far (a last row still half written is left out)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.csv (is it an rlfleet run folder?)")
    series: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    with open(path, newline="") as f:
        text = f.read()
    complete = text[: text.rfind("\n") + 1]
    for row in csv.DictReader(io.StringIO(complete, newline="")):
        steps, values = series[row["key"]]
        steps.append(int(row["step"]))
        values.append(float(row["value"]))
    return dict(series)


def plot_runs(run_dirs: list[Path], out: Path, title: str | None = None) -> Path:
    """One panel per curve (training episodic return, evaluation return), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(6 * len(CURVES), 4), squeeze=False)
    for run_dir in run_dirs:
        series = read_metrics(run_dir)
        for ax, key in zip(axes[0], CURVES, strict=True):
            if key in series:
                steps, values = series[key]
                ax.plot(
                    steps,
                    values,
                    label=Path(run_dir).name,
                    marker="o" if key.startswith("eval") else None,
                    markersize=3,
                )
    for ax, key in zip(axes[0], CURVES, strict=True):
        ax.set_title(key)
        ax.set_xlabel("env steps")
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
