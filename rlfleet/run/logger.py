"""Run logging: TensorBoard events, a long-format `metrics.csv`, and a tqdm progress bar.

Metric names follow one namespace: `charts/episodic_return`, `charts/SPS`, `eval/return_mean`,
`losses/<name>`. `metrics.csv` stays current for whoever watches a live run (`rlfleet plot`, `tail -f`, a
test waiting for the first rows): its first row is on disk at once, later ones at most `CSV_FLUSH_S` after
they are logged.
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

from tqdm import tqdm

CSV_FLUSH_S = 2.0
"""Longest time a row logged to `metrics.csv` waits in the file's buffer (the first row waits for nothing)."""


class RunLogger:
    """Writes scalars to TensorBoard and `metrics.csv` (columns: step, wall_time, key, value)."""

    def __init__(self, run_dir: Path, total_steps: int, initial_step: int = 0, progress: bool = True):
        from torch.utils.tensorboard import SummaryWriter  # heavy import, only when a run starts

        self.run_dir = run_dir
        self.writer = SummaryWriter(str(run_dir / "tb"))
        new_file = not (run_dir / "metrics.csv").exists()
        self._csv_file = open(run_dir / "metrics.csv", "a", newline="")  # noqa: SIM115 (closed in close())
        self._csv = csv.writer(self._csv_file)
        if new_file:
            self._csv.writerow(["step", "wall_time", "key", "value"])
        self._last_csv_flush = -math.inf
        self.start = time.perf_counter()
        self.bar = tqdm(
            total=total_steps,
            initial=initial_step,
            unit="step",
            dynamic_ncols=True,
            disable=not progress,
            mininterval=0.5,
        )

    def log(self, step: int, metrics: dict[str, float], elapsed: float | None = None) -> None:
        elapsed = time.perf_counter() - self.start if elapsed is None else elapsed
        for key, value in metrics.items():
            value = float(value)
            if math.isnan(value):
                continue
            self.writer.add_scalar(key, value, step)
            self._csv.writerow([step, f"{elapsed:.3f}", key, f"{value:.6g}"])
        if time.monotonic() - self._last_csv_flush >= CSV_FLUSH_S:
            self._csv_file.flush()
            self._last_csv_flush = time.monotonic()

    def progress(self, step: int, **postfix: float | str) -> None:
        self.bar.update(step - self.bar.n)
        if postfix:
            self.bar.set_postfix(
                {k: (f"{v:.1f}" if isinstance(v, float) else v) for k, v in postfix.items()}, refresh=False
            )

    def flush(self) -> None:
        self.writer.flush()
        self._csv_file.flush()

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        self._csv_file.close()
