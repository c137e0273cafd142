"""What a sweep shows: a progress bar over its trials while it runs; at its end the table of all trials
(`trials.csv`, `summary.md`, the terminal), the best trial as a ready `rlfleet train` command, the final score
against each searched value (`scatter.png`, the A3C paper's Figures 2 and S11) and every trial's learning curve
(`curves.png`)."""

from __future__ import annotations

import csv
import json
import math
import shlex
from pathlib import Path
from typing import Any

from ray.tune import Callback

from rlfleet.algos import resolve
from rlfleet.envs.kwargs import parse_env_value
from rlfleet.fields import unmet_need
from rlfleet.run.plot import MetricsError, read_metrics
from rlfleet.tuning.space import Param
from rlfleet.tuning.spec import EXPLOITS, TUNE_FOLDER, Sweep, SweepResult

ENDED = {"solved": "solved", "time_limit": "time limit"}
"""How a trial's run that ended of itself says so (one that ran its steps: "finished")."""
ERROR_CHARS = 120  # of a failed trial's error in the table (its traceback is in the sweep's tune/ folder)
SHOWN_ROWS = 20  # of the table on the terminal (the files have all)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(_short(v) for v in value)
    return str(value)


class ProgressCallback(Callback):
    """A bar over the sweep's trials, and a line for each one that ends (its values, its score, how it ended).

    Ray Tune keeps its callbacks with the experiment (`tune/tuner.pkl`) and a restored experiment runs the ones it
    kept, not those of the command that resumes it: this callback is kept as its sweep only, and comes back as the
    callback this process made for that sweep folder (`rlfleet tune --resume`'s, with its --no-progress), or as a new
    one where there is none."""

    def __init__(self, spec: Sweep):
        self.spec = spec
        self.names = [p.name for p in spec.params]
        self.bar: Any = None
        self.best: float | None = None
        _SHOWING[spec.folder] = self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _progress_of, (self.spec.to_json(),)

    def _bar(self) -> Any:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.spec.tune.trials, unit="trial", disable=not self.spec.tune.progress,
                            dynamic_ncols=True, desc="trials")  # fmt: skip
        return self.bar

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        score = result.get(self.spec.tune.metric)
        if isinstance(score, int | float) and math.isfinite(score):
            better = max if self.spec.tune.better == "max" else min
            self.best = score if self.best is None else better(self.best, score)
            self._bar().set_postfix({"best": f"{self.best:.4g}"}, refresh=False)
        self._bar()

    def _ended(self, trial: Any, how: str) -> None:
        values = " ".join(f"{n}={_short(trial.config.get(n))}" for n in self.names)
        last = trial.last_result or {}
        score = last.get(self.spec.tune.metric)
        shown = (
            f"{self.spec.tune.metric} {score:.4g} after {last.get('env_steps', 0)} steps"
            if score is not None
            else "no evaluation"
        )
        bar = self._bar()
        if self.spec.tune.progress:
            bar.write(f"trial {trial.trial_id} {values}: {shown} ({how})")
        bar.update(1)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended(trial, "ended")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended(trial, "failed: see its error.txt in the sweep's tune/ folder")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if _SHOWING.get(self.spec.folder) is self:
            del _SHOWING[self.spec.folder]


_SHOWING: dict[str, ProgressCallback] = {}
"""The progress callback of each sweep this process runs, by the sweep's folder, until it is closed."""


def _progress_of(sweep: dict[str, Any]) -> ProgressCallback:
    """The progress callback that a kept one (`ProgressCallback.__reduce__`) comes back as: the one shown for its
    sweep folder, or for the same sweep (made at the same moment, of the same algorithm, env and search) in another
    folder, where the folder was copied or moved after Ray Tune kept the callback with the folder's old name."""
    spec = Sweep.from_json(sweep)
    same = (c for c in _SHOWING.values() if _identity(c.spec) == _identity(spec))
    return _SHOWING.get(spec.folder) or next(same, None) or ProgressCallback(spec)


def _identity(spec: Sweep) -> tuple[Any, ...]:
    """What a sweep is wherever its folder is."""
    return spec.created, spec.algo, spec.env, tuple(spec.search)


# ---------------------------------------------------------------------------------------------- the table
def _word(value: Any) -> str:
    """A value as `rlfleet train` reads it back from the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ",".join(_word(v) for v in value)
    if isinstance(value, str) and parse_env_value(value) != value:  # text that would read as a number: quoted
        return repr(value)
    return repr(value) if isinstance(value, float) else str(value)


def _acting(spec: Sweep, options: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A trial's `options` without the searched algorithm settings that did nothing in it, their switch (searched
    too) off there, as its run folder's config.json says: `rlfleet train` refuses them."""
    try:
        algo_config = json.loads((spec.trials_dir / row["trial"] / "config.json").read_text())["algo"]
    except (OSError, ValueError, KeyError, TypeError):  # a trial that never started: its options as they are
        return options
    config_cls, searched = resolve(spec.algo)[1], {p.name for p in spec.params if p.kind == "algo"}
    overrides = {
        name: value
        for name, value in options.get("overrides", {}).items()
        if name not in searched or unmet_need(config_cls, name, algo_config.get) is None
    }
    return {**options, "overrides": overrides}


def train_command(algo: str, env: str, options: dict[str, Any]) -> str:
    """The `rlfleet train` command line that runs `train(algo, env, **options)`."""
    parts = ["rlfleet", "train", algo, "--env", env]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "overrides":
            for k, v in value.items():
                if isinstance(v, dict):  # a network's keyword arguments
                    parts += [f"--{k.replace('_', '-')}", *(f"{a}={_word(b)}" for a, b in v.items())]
                else:
                    parts += ["--set", f"{k}={_word(v)}"]
        elif key in ("env_kwargs", "net_kwargs", "actor_net_kwargs", "critic_net_kwargs"):
            parts += [flag, *(f"{k}={_word(v)}" for k, v in value.items())]
        elif key == "progress" or value is None or value is False:
            continue
        elif value is True:
            parts.append(flag)
        else:
            parts += [flag, _word(value)]
    return shlex.join(parts)


def _trial_rows(spec: Sweep, grid: Any, interrupted: bool) -> tuple[list[dict[str, Any]], bool]:
    """One row per trial, and whether any trial has not ended (the sweep was `interrupted` before it could)."""
    params = spec.params
    rows, unfinished = [], False
    saved = saved_statuses(Path(spec.folder) / TUNE_FOLDER)
    for trial in grid._experiment_analysis.trials:  # noqa: SLF001 (Ray Tune's trials, with their last results)
        config, last = trial.config, trial.last_result or {}
        status = saved.get(trial.trial_id, trial.status)
        run_dir = spec.trials_dir / trial.trial_id
        result_file = run_dir / "result.json"
        result = _read_json(result_file)
        at_end = max(result.get("env_steps", 0), last.get("env_steps", 0)) >= _total_steps(run_dir)
        # a trial whose run ended as the sweep was interrupted may still be RUNNING in Tune's last saved state
        ended = at_end or result.get("stopped_by") in ENDED
        if status == "ERROR":
            error = _first_error_line(trial)
            how = f"error: {error}" if error else "error"
        elif (status in ("PENDING", "RUNNING") or (status == "PAUSED" and interrupted)) and not ended:
            how, unfinished = "unfinished", True  # --resume goes on with it (a sweep's end leaves HyperBand's
            # losers PAUSED: stopped by the scheduler, below)
        elif result.get("stopped_by") in ENDED:
            how = ENDED[result["stopped_by"]]
        elif at_end:
            how = "finished"  # (HyperBand may pause, ASHA stop, a trial at its last evaluation: its end)
        else:  # stopped at a report (its result.json may not have been written before its actor ended)
            how = "stopped by the scheduler"
        score = last.get(spec.tune.metric)
        rows.append({
            "trial": trial.trial_id,
            **{p.name: config.get(p.name) for p in params},
            "score": score,
            "eval_return_mean": last.get("eval/return_mean"),
            "eval_return_best": last.get("eval/return_best"),
            "env_steps": last.get("env_steps", result.get("env_steps")),
            "solved": bool(last.get("solved", result.get("solved", False))),
            "exploits": _count_lines(run_dir / EXPLOITS),
            "status": how,
            "run_dir": str(run_dir),
        })  # fmt: skip
    return rows, unfinished


def saved_statuses(folder: Path) -> dict[str, str]:
    """Each trial's status in the latest experiment state Ray Tune saved in `folder` (what `Tuner.restore` goes on
    from: an interrupted sweep's unfinished trials are PENDING or RUNNING there, while the trials of the ended
    `fit` all read TERMINATED)."""
    states = sorted(folder.glob("experiment_state-*.json"))
    if not states:
        return {}
    try:
        data = json.loads(states[-1].read_text())
        trials = [json.loads(t[0]) if isinstance(t[0], str) else t[0] for t in data["trial_data"]]
        return {t["trial_id"]: t["status"] for t in trials}
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}


def _read_json(path: Path) -> dict[str, Any]:
    """A trial's JSON file; {} where there is none (or half of one: its actor ended while it was written)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _total_steps(run_dir: Path) -> float:
    """The env steps a trial's run was to take (its config.json; inf where it wrote none)."""
    return float(_read_json(run_dir / "config.json").get("total_steps", math.inf))


def _first_error_line(trial: Any) -> str:
    """The last line of a failed trial's traceback (the exception), as Tune kept it."""
    path = getattr(trial, "error_file", None) or ""
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError:
        return ""
    last = lines[-1] if lines else ""
    return last if len(last) <= ERROR_CHARS else last[: ERROR_CHARS - 3] + "..."


def _count_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0


def _has_ended(row: dict[str, Any]) -> bool:
    """Whether a trial's row is of a trial that ended (solved, finished, at its time limit or stopped by the
    scheduler): not one that failed or has not ended (an interrupted sweep's, which --resume goes on with)."""
    return row["status"] != "unfinished" and not row["status"].startswith("error")


def _ranked(rows: list[dict[str, Any]], better: str) -> list[dict[str, Any]]:
    """The rows best first: the trials that ended, by score, then those that failed or have not ended, by score,
    then those without a score. A failed trial's last score may be its best moment before the crash, and an unfinished
    one's is where it stopped: the best trial is one that ended, where any did."""
    scored = [r for r in rows if isinstance(r["score"], int | float) and math.isfinite(r["score"])]
    rest = [r for r in rows if r not in scored]
    by_score = sorted(scored, key=lambda r: r["score"], reverse=better == "max")
    return [r for r in by_score if _has_ended(r)] + [r for r in by_score if not _has_ended(r)] + rest


def _table(rows: list[dict[str, Any]], names: list[str], metric: str) -> list[list[str]]:
    head = ["trial", *names, metric, "solved", "env steps", "status"]
    body = [[r["trial"], *(_short(r[n]) for n in names), _short(r["score"]) if r["score"] is not None else "-",
             "yes" if r["solved"] else "no", str(r["env_steps"] or 0), r["status"]] for r in rows]  # fmt: skip
    return [head, *body]


def _aligned(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table)


def summarize(spec: Sweep, grid: Any, interrupted: bool) -> SweepResult:
    """Write `trials.csv`, `summary.md`, `scatter.png` and `curves.png`; print the table and the best trial's
    command; return the `SweepResult`."""
    folder, params, metric = Path(spec.folder), spec.params, spec.tune.metric
    rows, unfinished = _trial_rows(spec, grid, interrupted)
    rows = _ranked(rows, spec.tune.better)
    names = [p.name for p in params]
    with open(folder / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        writer.writerows(rows)
    best = next((r for r in rows if r["score"] is not None), None)
    command = None
    if best is not None:
        config = {n: best[n] for n in names}
        command = train_command(spec.algo, spec.env, _acting(spec, spec.trial_options(config, best["trial"]), best))
    table = _table(rows, names, metric)
    solved = sum(r["solved"] for r in rows)
    lines = [
        f"# Sweep: {spec.algo} on {spec.env}",
        "",
        f"{len(rows)} trials ({spec.tune.scheduler}), searched: {', '.join(spec.search)}; ranked by {metric} "
        f"({spec.tune.better}); {solved} of {len(rows)} solved.",
        "",
    ]
    caveat = "" if best is None or _has_ended(best) else f"{best['status']}; no trial ended"
    if best is not None:
        said = f"{metric} {_short(best['score'])}{caveat and ', ' + caveat}"
        lines += [f"Best trial: {best['trial']} ({said}); train it with:", "", f"    {command}", ""]
        if spec.tune.scheduler == "pbt":
            lines += ["PBT changed its trials' values as they trained (each trial's exploits.jsonl); the command "
                      "runs the best trial's last values from the start.", ""]  # fmt: skip
    lines += ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    (folder / "summary.md").write_text("\n".join(lines) + "\n")
    plots = []
    for draw, file in ((_scatter, "scatter.png"), (_curves, "curves.png")):
        try:
            draw(spec, params, rows, folder / file)
            plots.append(file)
        except (MetricsError, ValueError, OSError) as exc:  # a plot must never lose a sweep's results
            print(f"warning: could not draw {file}: {exc}")
    shown = _table(rows[:SHOWN_ROWS], names, metric)
    more = f"\n... {len(rows) - SHOWN_ROWS} more in trials.csv" if len(rows) > SHOWN_ROWS else ""
    print(f"{_aligned(shown)}{more}")
    if best is not None:
        print(f"best trial {best['trial']}: {metric} {_short(best['score'])}{caveat and f' ({caveat})'}\n  {command}")
    print(f"sweep folder: {folder} (summary.md, trials.csv, {', '.join(plots)})")
    return SweepResult(folder, rows, best, command, interrupted or unfinished)


# ---------------------------------------------------------------------------------------------- plots
def _scatter(spec: Sweep, params: list[Param], rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib.pyplot as plt

    fig = scatter_figure(spec, params, rows)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def scatter_figure(spec: Sweep, params: list[Param], rows: list[dict[str, Any]]) -> Any:
    """The final score against each searched value, one panel per name, one point per trial with a score (solved
    ones as circles)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in rows if isinstance(r["score"], int | float)]
    fig, axes = plt.subplots(1, len(params), figsize=(5 * len(params), 4), squeeze=False)
    for ax, p in zip(axes[0], params, strict=True):
        values = [r[p.name] for r in scored]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if numeric:
            xs = values
        else:  # choices that are no numbers: one column each, in the order given
            labels = [_short(v) for v in p.args]
            xs = [labels.index(_short(v)) if _short(v) in labels else -1 for v in values]
            ax.set_xticks(range(len(labels)), labels)
        for solved, marker in ((True, "o"), (False, "x")):
            pts = [(x, r["score"]) for x, r in zip(xs, scored, strict=True) if r["solved"] == solved]
            if pts:
                ax.scatter(*zip(*pts, strict=True), marker=marker, label="solved" if solved else "not solved")
        if p.log_scale:
            ax.set_xscale("log")
        ax.set_xlabel(p.name)
        ax.set_ylabel(spec.tune.metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{spec.algo} on {spec.env}: {len(scored)} trials")
    fig.tight_layout()
    return fig


def _curves(spec: Sweep, params: list[Param], rows: list[dict[str, Any]], out: Path) -> None:
    """Every trial's evaluation return against env steps (a legend where there are few)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        try:
            series = read_metrics(Path(r["run_dir"]))
        except MetricsError:
            continue  # a trial that failed before its first row
        if "eval/return_mean" in series:
            label = f"{r['trial']} " + " ".join(f"{p.name}={_short(r[p.name])}" for p in params)
            ax.plot(*series["eval/return_mean"], marker="o", markersize=2, linewidth=1, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval/return_mean")
    ax.set_title(f"{spec.algo} on {spec.env}: every trial")
    ax.grid(alpha=0.3)
    if 0 < len(ax.lines) <= 12:
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
