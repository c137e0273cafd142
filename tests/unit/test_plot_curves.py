"""`rlfleet plot`'s figure: a curve of one row is seen (a marker), a run folder given as `.` is named, and the x axis
says what the runs' steps count (gradient steps for a bc run, on the offline architecture)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from rlfleet.run.plot import plot_runs, step_unit  # noqa: E402


def run_folder(path: Path, rows: list[tuple[int, str, float]], arch: str | None = None) -> Path:
    path.mkdir(parents=True)
    lines = ["step,wall_time,key,value"] + [f"{step},0.1,{key},{value}" for step, key, value in rows]
    (path / "metrics.csv").write_text("\n".join(lines) + "\n")
    if arch is not None:
        (path / "config.json").write_text(
            json.dumps({"run": {"algo": "bc" if arch == "offline" else "ppo", "arch": arch}})
        )
    return path


@pytest.fixture
def figure(monkeypatch):
    """The axes `plot_runs` draws on, kept for the test to look at."""
    seen: dict = {}
    subplots = plt.subplots

    def spy(*args, **kwargs):
        fig, axes = subplots(*args, **kwargs)
        seen["axes"] = axes[0]
        return fig, axes

    monkeypatch.setattr(plt, "subplots", spy)
    yield seen
    plt.close("all")


def test_a_curve_of_one_row_is_drawn_as_a_point(tmp_path, figure):
    run = run_folder(tmp_path / "one", [(100, "charts/episodic_return", 20.0)])
    plot_runs([run], tmp_path / "c.png")
    (line,) = figure["axes"][0].lines
    assert len(line.get_xdata()) == 1 and line.get_marker() not in (None, "None", "", " ")
    longer = run_folder(tmp_path / "two", [(100, "charts/episodic_return", 20.0), (200, "charts/episodic_return", 30)])
    plot_runs([longer], tmp_path / "c.png")
    assert figure["axes"][0].lines[0].get_marker() in (None, "None", "", " ")  # a training curve: a line alone


def test_a_run_folder_given_as_dot_is_named_after_the_folder(tmp_path, figure, monkeypatch):
    run = run_folder(tmp_path / "ppo-run", [(100, "eval/return_mean", 20.0), (200, "eval/return_mean", 30.0)])
    monkeypatch.chdir(run)
    plot_runs([Path(".")], tmp_path / "c.png")
    assert [line.get_label() for line in figure["axes"][1].lines] == ["ppo-run"]
    assert [text.get_text() for text in figure["axes"][1].get_legend().get_texts()] == ["ppo-run"]


def test_the_x_axis_counts_gradient_steps_for_a_bc_run(tmp_path, figure):
    rows = [(500, "eval/return_mean", 200.0), (1000, "eval/return_mean", 500.0)]
    bc = run_folder(tmp_path / "bc", rows, arch="offline")
    ppo = run_folder(tmp_path / "ppo", rows, arch="single")
    old = run_folder(tmp_path / "old", rows)  # no config.json: env steps
    assert [step_unit(r) for r in (bc, ppo, old)] == ["gradient steps", "env steps", "env steps"]
    plot_runs([bc], tmp_path / "c.png")
    assert {ax.get_xlabel() for ax in figure["axes"]} == {"gradient steps"}
    plot_runs([ppo, old], tmp_path / "c.png")
    assert {ax.get_xlabel() for ax in figure["axes"]} == {"env steps"}
    plot_runs([ppo, bc], tmp_path / "c.png")
    assert {ax.get_xlabel() for ax in figure["axes"]} == {"env steps / gradient steps"}


def test_a_run_has_one_colour_in_both_panels_and_every_run_its_own(tmp_path, figure):
    """A run without a training curve (bc) shifted every later run's colour in that panel; past ten runs (a sweep's
    trials) colours repeated."""
    both = [(100, "charts/episodic_return", 1.0), (100, "eval/return_mean", 2.0)]
    runs = [run_folder(tmp_path / "bc", [(100, "eval/return_mean", 2.0)], arch="offline")]
    runs += [run_folder(tmp_path / f"r{k}", both) for k in range(12)]
    plot_runs(runs, tmp_path / "c.png")
    train, evaluation = ({line.get_label(): matplotlib.colors.to_hex(line.get_color()) for line in ax.lines}
                         for ax in figure["axes"])  # fmt: skip
    assert all(evaluation[name] == color for name, color in train.items())
    assert len(set(evaluation.values())) == len(runs)
