"""Run logging: TensorBoard events, a long-format `metrics.csv`, and a tqdm progress bar.

Metric names follow one namespace: `charts/episodic_return`, `charts/SPS`, `eval/return_mean`,
`losses/<name>`. `metrics.csv` stays current for whoever watches a live run (`rlfleet plot`, `tail -f`, a
test waiting for the first rows): its first row is on disk at once, later ones at most `CSV_FLUSH_S` after
they are logged, however long the run then goes without logging (a long evaluation): a row that has to wait is
flushed by a timer thread, at most one at a time. `RunLogger.flush` puts everything logged on disk at once (the
runner's call before it saves a checkpoint).

A resumed run continues the same files from its checkpoint's step: the rows logged after it (by the run that
crashed or was killed later) are dropped from `metrics.csv` once, atomically, since the resumed run logs those
steps again; TensorBoard's events cannot be rewritten, so the new writer tells TensorBoard to hide the old
events after that step (`purge_step`) and it shows the resumed run's values there.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


def json_text(value: Any, **kwargs: Any) -> str:
    """`value` as strict JSON, which every reader parses (`config.json`, `result.json`, `rlfleet eval`'s output): a
    float that is not finite (`--stop-return inf`, `--time-limit inf`), which Python would write as the JavaScript
    words Infinity or NaN, is written as the text "inf", "-inf" or "nan" (what `float()` reads back)."""
    return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


CSV_DIGITS = 9
"""Significant digits of a value in `metrics.csv`: every float32 (a loss) and every count below 10⁹ (an env step,
`charts/SPS`) reads back as it was."""

CSV_FLUSH_S = 2.0
"""Longest time a row logged to `metrics.csv` waits in the file's buffer (the first row waits for nothing)."""


def keep_rows_up_to(path: Path, step: int) -> None:
    """Rewrite `metrics.csv` at `path` (atomically) without the rows logged after `step` and without a last row
    cut short (no line end: the writer was killed mid-row)."""
    with open(path, newline="") as f:
        text = f.read()
    complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(complete, newline="")))
    kept = rows[:1] + [r for r in rows[1:] if len(r) == 4 and r[0].isdigit() and int(r[0]) <= step]
    if len(kept) == len(rows) and complete == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(kept)
    os.replace(tmp, path)


class RunLogger:
    """Writes scalars to TensorBoard and `metrics.csv` (columns: step, wall_time, key, value; a value of `CSV_DIGITS`
    significant digits; a NaN value, which says "not measured", is left out).

    Where `metrics.csv` exists the run is resumed from a checkpoint at `initial_step`: what was logged after
    that step is dropped (see the module docstring).
    """

    def __init__(self, run_dir: Path, total_steps: int, initial_step: int = 0, progress: bool = True):
        from torch.utils.tensorboard import SummaryWriter  # heavy import, only when a run starts

        self.run_dir = run_dir
        path = run_dir / "metrics.csv"
        resumed = path.exists()
        if resumed:
            keep_rows_up_to(path, initial_step)
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=initial_step + 1 if resumed else None)
        new_file = not resumed or path.stat().st_size == 0
        self._csv_file = open(run_dir / "metrics.csv", "a", newline="")  # noqa: SIM115 (closed in close())
        self._csv = csv.writer(self._csv_file)
        if new_file:
            self._csv.writerow(["step", "wall_time", "key", "value"])
        self._last_csv_flush = -math.inf
        self._csv_lock = threading.Lock()  # the file is written here and flushed by the timer's thread too
        self._csv_timer: threading.Timer | None = None  # set while a row waits for its flush
        self._closed = False
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
        with self._csv_lock:
            for key, value in metrics.items():
                value = float(value)
                if math.isnan(value):  # not measured: `optimize`'s grad norm without clipping, a constant target's EV
                    continue
                self.writer.add_scalar(key, value, step)
                self._csv.writerow([step, f"{elapsed:.3f}", key, f"{value:.{CSV_DIGITS}g}"])
            waited = time.monotonic() - self._last_csv_flush
            if waited >= CSV_FLUSH_S:
                self._flush_csv()
            elif self._csv_timer is None:  # the rows wait: a timer flushes them CSV_FLUSH_S after the last flush
                self._csv_timer = threading.Timer(CSV_FLUSH_S - waited, self._flush_csv_due)
                self._csv_timer.daemon = True
                self._csv_timer.start()

    def _flush_csv(self) -> None:
        """Put the rows logged so far on disk (with `_csv_lock` held)."""
        if self._csv_timer is not None:
            self._csv_timer.cancel()
            self._csv_timer = None
        if not self._closed:
            self._csv_file.flush()
        self._last_csv_flush = time.monotonic()

    def _flush_csv_due(self) -> None:
        """The timer's flush: rows have waited `CSV_FLUSH_S` with no `log` call to flush them."""
        with self._csv_lock:
            self._csv_timer = None
            self._flush_csv()

    def progress(self, step: int, **postfix: float | str) -> None:
        self.bar.update(step - self.bar.n)
        if postfix:
            self.bar.set_postfix(
                {k: (f"{v:.1f}" if isinstance(v, float) else v) for k, v in postfix.items()}, refresh=False
            )

    def note(self, text: str) -> None:
        """A line for the user on the terminal, above the progress bar (which it leaves intact)."""
        tqdm.write(text)

    def flush(self) -> None:
        """Put everything logged so far on disk: the rows of `metrics.csv` and the TensorBoard events."""
        self.writer.flush()
        with self._csv_lock:
            self._flush_csv()

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        with self._csv_lock:
            if self._csv_timer is not None:
                self._csv_timer.cancel()
                self._csv_timer = None
            self._closed = True
            self._csv_file.close()
