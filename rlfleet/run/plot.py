"""Learning-curve plots from run folders' `metrics.csv`."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlfleet.fields import ConfigError
from rlfleet.run.paths import check_named, check_output_file

CURVES = ("charts/episodic_return", "eval/return_mean")
COLUMNS = ("step", "key", "value")
"""Columns of `metrics.csv` that a plot reads (the file also has `wall_time`)."""


class MetricsError(ValueError):
    """A run folder has no readable `metrics.csv`."""


def read_metrics(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """Every metric's (steps, values) from a run folder's `metrics.csv`; of a run still going, the rows
    written so far (a last row still half written is left out). A file that is not an rlfleet metrics.csv
    (no `step,key,value` header, a row that is no number) is a `MetricsError` naming the file and line."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.csv"
    if run_dir.exists() and not run_dir.is_dir():
        raise MetricsError(f"{run_dir} is a file, not a run folder (give the folder that holds metrics.csv)")
    if not path.is_file():
        raise MetricsError(f"{run_dir} has no metrics.csv (is it an rlfleet run folder?)")
    series: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    try:
        with open(path, newline="") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise MetricsError(f"cannot read {path}: not text (is it an rlfleet metrics.csv?)") from None
    complete = text[: text.rfind("\n") + 1]
    if not complete:  # a run that has not written its header yet
        return {}
    reader = csv.DictReader(io.StringIO(complete, newline=""))
    try:
        if not set(COLUMNS) <= set(reader.fieldnames or ()):
            raise MetricsError(f"cannot read {path}: its header has no columns {', '.join(COLUMNS)}")
        for row in reader:
            steps, values = series[row["key"]]
            steps.append(int(row["step"]))
            values.append(float(row["value"]))
    except (csv.Error, ValueError, TypeError) as exc:
        if isinstance(exc, MetricsError):
            raise
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise MetricsError(f"cannot read {path} line {reader.line_num}: {detail}") from None
    return dict(series)


def step_unit(run_dir: Path) -> str:
    """What a run's `step` counts, by its `config.json`: gradient steps on the `offline` architecture (bc), which
    steps no training env; env steps elsewhere, and where the file is missing or unreadable."""
    try:
        run = json.loads((Path(run_dir) / "config.json").read_text())["run"]
    except (OSError, ValueError, KeyError, TypeError):
        return "env steps"
    return "gradient steps" if isinstance(run, dict) and run.get("arch") == "offline" else "env steps"


def check_plot_output(out: str | Path) -> Path:
    """The image file a plot writes: a format matplotlib writes (by its suffix), not a folder, in a writable
    folder (missing folders are made)."""
    from matplotlib.backend_bases import FigureCanvasBase

    check_named(out, "-o", "give the name of an image file to write (.png)")
    out = Path(out)
    formats = FigureCanvasBase.get_supported_filetypes()
    if out.is_dir():
        raise ConfigError(f"-o {out} is a folder; give the name of an image file to write (.png)")
    if out.suffix.lstrip(".").lower() not in formats:
        shown = ", ".join(f".{f}" for f in ("png", "pdf", "svg", "jpg") if f in formats)
        raise ConfigError(f"-o {out}: write the plot to an image file ({shown}, ...), not {out.suffix or 'no suffix'}")
    return check_output_file(out, "-o")


def run_colors(plt: Any, n: int) -> list[Any]:
    """A colour for each of `n` runs, all different: matplotlib's ten, then tab20's twenty, then a colour map."""
    if n <= 10:
        return [f"C{k}" for k in range(n)]
    cmap = plt.get_cmap("tab20" if n <= 20 else "turbo")
    return [cmap(k if n <= 20 else k / (n - 1)) for k in range(n)]


def plot_runs(run_dirs: list[Path], out: str | Path, title: str | None = None) -> Path:
    """One panel per curve (training episodic return, evaluation return), one line per run, named after its folder;
    the x axis says what the runs' steps count (`step_unit`). A curve of one point is drawn as a marker.

    Every run's metrics are read before the figure is drawn: a run folder that cannot be read is a
    `MetricsError` and no image is written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = check_plot_output(out)
    all_series = [(run_dir, read_metrics(run_dir)) for run_dir in run_dirs]
    units = sorted({step_unit(run_dir) for run_dir in run_dirs})  # env steps, gradient steps
    fig, axes = plt.subplots(1, len(CURVES), figsize=(6 * len(CURVES), 4), squeeze=False)
    colors = run_colors(plt, len(all_series))
    for (run_dir, series), color in zip(all_series, colors, strict=True):
        for ax, key in zip(axes[0], CURVES, strict=True):
            if key in series:
                steps, values = series[key]
                ax.plot(
                    steps,
                    values,
                    color=color,  # the run's in both panels, also where it has no curve in one
                    label=Path(run_dir).resolve().name,  # `rlfleet plot .` too
                    marker="o" if key.startswith("eval") or len(steps) == 1 else None,
                    markersize=3,
                )
    for ax, key in zip(axes[0], CURVES, strict=True):
        ax.set_title(key)
        ax.set_xlabel(" / ".join(units))
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
