"""RunLogger: metrics.csv in long format, on disk for a watcher while the run goes on (the first row at once,
later rows at most CSV_FLUSH_S behind, whether or not the run logs again), `flush` (everything on disk at once),
and everything on disk after close; `read_metrics` (rlfleet plot) on a live file."""

import csv
import threading
import time

import numpy as np

from rlfleet.run import logger as logger_module
from rlfleet.run.logger import CSV_FLUSH_S, RunLogger
from rlfleet.run.plot import read_metrics


def rows_on_disk(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.reader(f))


def test_metrics_csv_is_current_for_a_watcher_while_the_run_goes_on(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(logger_module.time, "monotonic", lambda: clock[0])
    log = RunLogger(tmp_path, total_steps=100, progress=False)
    try:
        log.log(10, {"charts/SPS": 123.0}, elapsed=0.5)
        assert rows_on_disk(tmp_path) == [["step", "wall_time", "key", "value"], ["10", "0.500", "charts/SPS", "123"]]

        log.log(20, {"charts/SPS": 456.0}, elapsed=1.0)  # within CSV_FLUSH_S of the last flush: may wait
        clock[0] += CSV_FLUSH_S
        log.log(30, {"eval/return_mean": 500.0}, elapsed=2.5)  # CSV_FLUSH_S later: both rows are on disk
        assert [row[0] for row in rows_on_disk(tmp_path)[1:]] == ["10", "20", "30"]

        clock[0] += CSV_FLUSH_S / 4
        for step in range(40, 1000, 10):  # a burst inside CSV_FLUSH_S is not flushed row by row
            log.log(step, {"charts/SPS": 1.0}, elapsed=3.0)
        assert len(rows_on_disk(tmp_path)) < 1 + 3 + 96
    finally:
        log.close()
    assert len(rows_on_disk(tmp_path)) == 1 + 3 + 96  # close writes the rest


def test_metrics_csv_keeps_every_digit_of_a_count_or_a_float32_and_leaves_out_what_was_not_measured(tmp_path):
    """Values had 6 digits: 1234567 env steps read back as 1234570. NaN says "not measured" (`optimize`'s gradient
    norm where nothing clips): no row."""
    loss = float(np.float32(0.123456789))
    log = RunLogger(tmp_path, total_steps=100, progress=False)
    log.log(10, {"losses/grad_norm": float("nan"), "charts/env_steps": 1234567.0, "losses/policy": loss}, elapsed=0.5)
    log.close()
    values = {row[2]: float(row[3]) for row in rows_on_disk(tmp_path)[1:]}
    assert values["charts/env_steps"] == 1234567 and np.float32(values["losses/policy"]) == np.float32(loss)
    assert "losses/grad_norm" not in values


def test_a_resumed_run_appends_to_metrics_csv_under_one_header(tmp_path):
    first = RunLogger(tmp_path, total_steps=100, progress=False)
    first.log(10, {"charts/SPS": 1.0}, elapsed=0.1)
    first.close()
    second = RunLogger(tmp_path, total_steps=100, initial_step=10, progress=False)
    second.log(20, {"charts/SPS": 2.0}, elapsed=0.2)
    second.close()
    rows = rows_on_disk(tmp_path)
    assert rows[0] == ["step", "wall_time", "key", "value"] and [r[0] for r in rows[1:]] == ["10", "20"]


def test_a_resumed_run_drops_the_rows_logged_after_its_checkpoint(tmp_path):
    """The resumed run logs those steps again: its metrics.csv reads as one run."""
    first = RunLogger(tmp_path, total_steps=100, progress=False)
    for step in (10, 20, 30):
        first.log(step, {"charts/SPS": float(step)}, elapsed=step / 100)
    first.close()
    with open(tmp_path / "metrics.csv", "a", newline="") as f:
        f.write("20,0.250,eval/return_mean,-12")  # a row cut short by a kill
    second = RunLogger(tmp_path, total_steps=100, initial_step=20, progress=False)  # the checkpoint was at 20
    second.log(30, {"charts/SPS": 3.0}, elapsed=0.35)
    second.close()
    assert rows_on_disk(tmp_path) == [
        ["step", "wall_time", "key", "value"],
        ["10", "0.100", "charts/SPS", "10"],
        ["20", "0.200", "charts/SPS", "20"],
        ["30", "0.350", "charts/SPS", "3"],
    ]


def test_a_resumed_run_whose_metrics_csv_was_left_empty_writes_the_header(tmp_path):
    (tmp_path / "metrics.csv").write_text("")  # killed before its first row reached the disk
    log = RunLogger(tmp_path, total_steps=100, initial_step=20, progress=False)
    log.log(30, {"charts/SPS": 3.0}, elapsed=0.35)
    log.close()
    assert rows_on_disk(tmp_path) == [["step", "wall_time", "key", "value"], ["30", "0.350", "charts/SPS", "3"]]


def test_plot_reads_a_live_run_and_leaves_out_a_half_written_last_row(tmp_path):
    log = RunLogger(tmp_path, total_steps=100, progress=False)
    try:
        log.log(1000, {"eval/return_mean": 123.5}, elapsed=1.0)
        assert read_metrics(tmp_path) == {"eval/return_mean": ([1000], [123.5])}  # while the run goes on
    finally:
        log.close()
    with open(tmp_path / "metrics.csv", "a", newline="") as f:
        f.write("2000,2.000,eval/return_mean,-12")  # what a reader can meet: the buffer spilled mid-row
    assert read_metrics(tmp_path) == {"eval/return_mean": ([1000], [123.5])}
    with open(tmp_path / "metrics.csv", "a", newline="") as f:
        f.write("3.4\r\n")
    assert read_metrics(tmp_path) == {"eval/return_mean": ([1000, 2000], [123.5, -123.4])}


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_row_reaches_the_disk_in_time_with_no_later_log_call(tmp_path, monkeypatch):
    """A long evaluation or a quiet stretch logs nothing for a while: the rows logged before it do not wait for it."""
    monkeypatch.setattr(logger_module, "CSV_FLUSH_S", 0.2)
    log = RunLogger(tmp_path, total_steps=100, progress=False)
    try:
        log.log(10, {"charts/SPS": 1.0}, elapsed=0.1)  # the first row: at once
        log.log(20, {"charts/SPS": 2.0}, elapsed=0.2)  # within CSV_FLUSH_S of that flush: waits for the timer
        log.log(30, {"charts/SPS": 3.0}, elapsed=0.3)
        assert wait_for(lambda: len(rows_on_disk(tmp_path)) == 4, timeout=5.0), rows_on_disk(tmp_path)
        log.log(40, {"charts/SPS": 4.0}, elapsed=0.4)  # the timer went; the next one comes as the next row waits
        assert wait_for(lambda: len(rows_on_disk(tmp_path)) == 5, timeout=5.0), rows_on_disk(tmp_path)
    finally:
        log.close()


def test_flush_puts_the_rows_and_the_events_on_disk_at_once(tmp_path, monkeypatch):
    """What the runner calls before it saves a checkpoint: a kill after the save loses none of the rows before it."""
    monkeypatch.setattr(logger_module, "CSV_FLUSH_S", 3600.0)
    log = RunLogger(tmp_path, total_steps=100, progress=False)
    flushed = []
    real = log.writer.flush
    monkeypatch.setattr(log.writer, "flush", lambda: (flushed.append(True), real()))
    try:
        log.log(10, {"charts/SPS": 1.0}, elapsed=0.1)
        log.log(20, {"charts/SPS": 2.0}, elapsed=0.2)  # would wait an hour
        assert len(rows_on_disk(tmp_path)) == 2
        log.flush()
        assert [row[0] for row in rows_on_disk(tmp_path)[1:]] == ["10", "20"] and flushed
    finally:
        log.close()


def test_close_with_a_row_waiting_leaves_no_timer_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(logger_module, "CSV_FLUSH_S", 0.1)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    log = RunLogger(tmp_path, total_steps=100, progress=False)
    log.log(10, {"charts/SPS": 1.0}, elapsed=0.1)
    log.log(20, {"charts/SPS": 2.0}, elapsed=0.2)
    log.close()
    time.sleep(0.3)  # past the flush the timer would have made
    assert len(rows_on_disk(tmp_path)) == 3 and not failures


def test_a_checkpoint_is_saved_with_every_row_logged_before_it_on_disk(tmp_path, monkeypatch):
    """A run killed right after a checkpoint resumes from its step and never logs the rows before it again: they must
    be on disk when it is saved, not in the CSV buffer (whose 2 s flush a fast run outpaces)."""
    from rlfleet import train
    from rlfleet.run.runner import RunBase

    seen = []
    save = RunBase.save

    def checking(self, name="latest"):
        rows = (self.run_dir / "metrics.csv").read_text().splitlines()
        seen.append((self.state["evals"], sum(",eval/return_mean," in row for row in rows)))
        return save(self, name)

    monkeypatch.setattr(RunBase, "save", checking)
    train("ppo", "CartPole-v1", steps=4_096, eval_every=512, checkpoint_every=512, eval_episodes=1, stop_return=1e9,
          logdir=str(tmp_path), progress=False)  # fmt: skip
    assert len(seen) >= 8 and all(evals == on_disk for evals, on_disk in seen), seen


def test_a_resumed_runs_rows_count_wall_time_from_the_runs_start(tmp_path, monkeypatch):
    """Rows logged without their elapsed time (a restart count, a note) take the logger's clock, which a resumed run
    sets to the run's start, as it does its own rows: a resumed run's wall_time column does not fall back to 0."""
    from rlfleet import train
    from rlfleet.run.runner import RunBase

    first = train("ppo", "CartPole-v1", steps=1_024, eval_every=1_024, stop_return=1e9, name="r", logdir=str(tmp_path),
                  progress=False)  # fmt: skip
    start_logging = RunBase.start_logging

    def logging_a_row(self):
        logger, start = start_logging(self)
        logger.log(self.env_steps, {"charts/a_count": 1.0})
        return logger, start

    monkeypatch.setattr(RunBase, "start_logging", logging_a_row)
    train(resume=first.run_dir, steps=2_048, progress=False)
    with open(first.run_dir / "metrics.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["key"] == "charts/a_count")
    assert float(row["wall_time"]) >= first["wall_time_s"] * 0.9
