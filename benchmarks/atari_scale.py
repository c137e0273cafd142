"""The seeds' Atari experiments at scale, each run bounded by --minutes (and --frames if given): curves of the greedy
score against frames and against wall time, and a summary table.

Experiments (one run at a time, each `rlfleet.train` with `time_limit = --minutes`, and `steps` = --frames over the
frame skip where given: a run stops at whichever comes first):

  ppo    PPO with its learner on --device and --envs env workers (async vector envs for ALE ids): score against
         wall time (the goal on Pong: >= 18 within 10 minutes).
  a3c    A3C (hogwild) at each worker count of --workers: frames/s, its scaling over one worker, the time and
         frames to --reference (the first greedy evaluation at or above it), the A3C paper's Table 2 and Figure 3,
         and where a worker's segment goes (ms copying the shared parameters, acting, in the loss, back-propagating
         and applying the gradient to the shared parameters and statistics: the run's hogwild/<phase>_ms).
  apex   Ape-X DQN with --actors actors and the paper's unpaced learner on --device: actor frames/s, learner
         updates/s and samples/s (the paper: ~50k frames/s from 360 actors, 19 batches of 512 a second), score.
  gala   GALA (A2C on --arch gossip) with each learner count of --learners, then single-process A2C for as many
         frames as the biggest GALA run took (or twice --minutes): frames/s and score at equal frames.
  all    every experiment above, in that order.

Frames are env steps times the frame skip (4 for ALE ids, 1 for MinAtar); frames/s is the steady rate, the median
of a run's `charts/SPS` rows after the first, leaving out those whose interval holds an evaluation (start-up and
evaluations left out; the other rates likewise). Writes OUT/runs/<run> (the run folders), OUT/summary.json (every
run: options, frames, seconds, rates, the evaluations), OUT/summary.md (the tables), both after each run, and
OUT/curves_<experiment>.png.
Experiments run one at a time into one OUT add to its summary (with the same --env, --minutes, --frames and
--reference; an experiment run again replaces its entry); a run folder already in OUT/runs is an error before any
run (remove it to run that experiment again).

    python benchmarks/atari_scale.py ppo --env ALE/Pong-v5 --minutes 10 --device cuda --envs 16
    python benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 8 --workers 1,2,4,8,16
    python benchmarks/atari_scale.py all --env MinAtar/Breakout-v1 --minutes 1 --frames 20000 --workers 2 \
        --learners 2 --actors 1 --out /tmp/scale        # the smoke run CI makes (a minute when the machine is idle)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

from harness import counts

EXPERIMENTS = ("ppo", "a3c", "apex", "gala")
PHASES = ("pull", "act", "loss", "backward", "apply")  # a hogwild worker's segment (rlfleet.arch.hogwild.PHASES)
REFERENCE = {"ALE/Pong-v5": -15.0, "PongNoFrameskip-v4": -15.0, "MinAtar/Breakout-v1": 3.0}
"""The score every worker count reaches within a short run (Pong: -15, 6 points above a random policy's -21, which
A3C reaches early in the paper's Figure 3 curves at every thread count; MinAtar Breakout: 3, seven times random)."""


def machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "unknown")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """metrics.csv as key -> [(env steps, seconds, value), ...]."""
    rows: dict[str, list[tuple[int, float, float]]] = {}
    with open(run_dir / "metrics.csv") as f:
        for step, seconds, key, value in csv.reader(f):
            if step != "step":
                rows.setdefault(key, []).append((int(step), float(seconds), float(value)))
    return rows


def steady_rows(rows: dict[str, list], key: str) -> list[float]:
    """The values of a rate the run logs with its `charts/SPS` rows (each over the time since the row before) that
    neither start-up nor an evaluation is in: its rows after the first, leaving out those whose interval holds the
    start of an evaluation, which the rate then spans (an evaluation's row comes after the rate's row of its update,
    at the same or a later time)."""
    logged = rows.get(key, [])
    starts = [seconds for _, seconds, _ in rows.get("eval/return_mean", [])]
    return [v for (_, before, _), (_, t, v) in pairwise(logged) if not any(before <= e < t for e in starts)]


def median_of(rows: dict[str, list], key: str) -> float | None:
    """The steady value of a rate: the median of its `steady_rows`; where there are none (an evaluation in every
    interval), of its rows after the first; of one row, its value."""
    logged = rows.get(key, [])
    values = steady_rows(rows, key) or [v for _, _, v in logged[1:]] or [v for _, _, v in logged]
    return statistics.median(values) if values else None


def one_run(name: str, algo: str, args: argparse.Namespace, out: Path, **options: Any) -> dict[str, Any]:
    """One bounded run; what the tables and curves need from it."""
    from rlfleet import train

    print(f"[atari_scale] {name}: {algo} {options}", file=sys.stderr, flush=True)
    options.setdefault("time_limit", args.minutes * 60)
    if args.frames is not None:
        options.setdefault("steps", max(1, args.frames // args.frame_skip))
    result = train(algo, args.env, seed=args.seed, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                   stop_return=1e9, logdir=str(out / "runs"), name=name, progress=False, **options)  # fmt: skip
    r = result.result
    rows = read_metrics(result.run_dir)
    evals = [(step, seconds, value) for step, seconds, value in rows.get("eval/return_mean", [])]
    reached = next(((s, t) for s, t, v in evals if v >= args.reference), None)
    skip = args.frame_skip
    if len(rows.get("charts/SPS", [])) > 1 and not steady_rows(rows, "charts/SPS"):
        note = "so its frames/s includes evaluation time (a larger --eval-every leaves intervals without one)"
        print(f"[atari_scale] {name}: an evaluation falls in every charts/SPS interval, {note}", file=sys.stderr)
    return {
        "name": name,
        "algo": algo,
        "options": {k: v for k, v in options.items() if k != "time_limit"},
        "frames": r["env_steps"] * skip,
        "seconds": r["wall_time_s"],
        # steady: the median of the run's SPS rows after the first and without an evaluation in them
        "frames_per_s": (median_of(rows, "charts/SPS") or r["env_steps"] / max(r["wall_time_s"], 1e-9)) * skip,
        "score": r["eval_return_mean"],
        "best_score": r["best_eval_return"],
        "reference_at_s": None if reached is None else reached[1],
        "reference_at_frames": None if reached is None else reached[0] * skip,
        "evals": [[s * skip, t, v] for s, t, v in evals],
        "actor_frames_per_s": (median_of(rows, "charts/actor_sps") or 0) * skip or None,
        "learner_updates_per_s": median_of(rows, "charts/learner_ups"),
        "learner_samples_per_s": median_of(rows, "charts/replay_sample_rate"),
        "segment_ms": {p: median_of(rows, f"hogwild/{p}_ms") for p in PHASES if f"hogwild/{p}_ms" in rows} or None,
        "device": r.get("device"),
        "run_dir": str(result.run_dir),
    }


# Each experiment yields its runs one at a time, so that the summary is written after each (a run cut short by a
# timeout loses only itself).
def run_ppo(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    yield one_run("ppo", "ppo", args, out, n_envs=args.envs, device=args.device)


def run_a3c(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    for n in args.workers:
        yield one_run(f"a3c-{n}", "a3c", args, out, arch="hogwild", workers=n)


def run_apex(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    options = dict(arch="apex", actors=args.actors, unpaced=True, device=args.device)
    yield one_run(f"apex-{args.actors}", "dqn", args, out, **options)


def run_gala(args: argparse.Namespace, out: Path) -> Iterator[dict[str, Any]]:
    frames = 0
    for k in args.learners:
        run = one_run(f"gala-{k}", "a2c", args, out, arch="gossip", learners=k)
        frames = max(frames, run["frames"])
        yield run
    yield one_run("a2c", "a2c", args, out, steps=max(1, frames // args.frame_skip), time_limit=args.minutes * 60 * 2)


RUNNERS = {"ppo": run_ppo, "a3c": run_a3c, "apex": run_apex, "gala": run_gala}


def run_names(experiment: str, args: argparse.Namespace) -> list[str]:
    """The run folders (in OUT/runs) an experiment makes."""
    if experiment == "a3c":
        return [f"a3c-{n}" for n in args.workers]
    if experiment == "apex":
        return [f"apex-{args.actors}"]
    if experiment == "gala":
        return [f"gala-{k}" for k in args.learners] + ["a2c"]
    return [experiment]


SETTINGS = ("env", "minutes", "frames", "reference")
"""What the runs of one summary share (its tables' heads say them)."""


def setting(key: str, value: Any) -> str:
    """A setting of a summary as its option would give it."""
    if value is None:
        return f"no --{key}"
    return f"--{key} {value:g}" if isinstance(value, float) else f"--{key} {value}"


def earlier_summary(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The experiments of OUT/summary.json, which this invocation adds to; a parser error (before any run) where its
    runs had other settings, or where a run folder this invocation makes is already in OUT/runs."""
    names = [name for experiment in args.experiments for name in run_names(experiment, args)]
    there = [name for name in names if (out / "runs" / name).exists()]
    if there:
        parser.error(f"{out / 'runs'} already holds {', '.join(there)}: give another --out, or remove "
                     f"{'it' if len(there) == 1 else 'them'} to run again")  # fmt: skip
    path = out / "summary.json"
    if not path.exists():
        return {}
    try:
        earlier = json.loads(path.read_text())
        experiments = earlier["experiments"]
        if not isinstance(experiments, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        parser.error(f"{path} is not a summary this script wrote: give another --out, or remove it")
    differ = [setting(key, earlier[key]) for key in SETTINGS if key in earlier and earlier[key] != getattr(args, key)]
    if differ:
        parser.error(f"{path} holds runs with {', '.join(differ)}: give those, or another --out")
    return experiments


def score_at(run: dict[str, Any], frames: int) -> float | None:
    """The evaluation nearest to `frames` (a run steps whole segments, so its last one may be a little past)."""
    return min(run["evals"], key=lambda e: abs(e[0] - frames))[2] if run["evals"] else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def segment_times(run: dict[str, Any]) -> str:
    """A hogwild run's median milliseconds per segment in each phase, `pull / act / loss / backward / apply`."""
    times = run.get("segment_ms") or {}
    return " / ".join(fmt(times.get(p), 2) for p in PHASES)


def table(experiment: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    budget = f"{args.minutes:g} min" + ("" if args.frames is None else f" or {args.frames:,} frames")
    head = f"### {experiment} on {args.env} ({budget} a run)\n\n"
    if experiment == "a3c":
        base = next((r for r in runs if r["options"].get("workers") == 1), runs[0])
        lines = ["| workers | frames/s | scaling | frames | score | time to " + f"{args.reference:g} (s) | speedup | "
                 "ms per segment: " + " / ".join(PHASES) + " |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in runs:
            t1, tn = base["reference_at_s"], r["reference_at_s"]
            speedup = ratio(t1, tn)
            lines.append(f"| {r['options']['workers']} | {fmt(r['frames_per_s'], 0)} | "
                         f"{fmt(ratio(r['frames_per_s'], base['frames_per_s']), 2)}× | {fmt(r['frames'])} | "
                         f"{fmt(r['score'])} | {fmt(tn)} | {fmt(speedup, 2)} | {segment_times(r)} |")  # fmt: skip
    elif experiment == "apex":
        lines = ["| actors | actor frames/s | learner updates/s | learner samples/s | frames | score | device |",
                 "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in runs:
            lines.append(f"| {r['options']['actors']} | {fmt(r['actor_frames_per_s'], 0)} | "
                         f"{fmt(r['learner_updates_per_s'])} | {fmt(r['learner_samples_per_s'], 0)} | "
                         f"{fmt(r['frames'])} | {fmt(r['score'])} | {r['device']} |")  # fmt: skip
    elif experiment == "gala":
        a2c = runs[-1]
        lines = ["| run | frames/s | frames | score | A2C at these frames |", "|---|---|---|---|---|"]
        for r in runs:
            equal = score_at(a2c, r["frames"]) if r is not a2c else None
            lines.append(f"| {r['name']} | {fmt(r['frames_per_s'], 0)} | {fmt(r['frames'])} | {fmt(r['score'])} | "
                         f"{fmt(equal)} |")  # fmt: skip
    else:
        lines = ["| run | device | frames/s | frames | score | best | time to " + f"{args.reference:g} (s) |",
                 "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in runs:
            lines.append(f"| {r['name']} | {r['device']} | {fmt(r['frames_per_s'], 0)} | {fmt(r['frames'])} | "
                         f"{fmt(r['score'])} | {fmt(r['best_score'])} | {fmt(r['reference_at_s'])} |")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def plot(experiment: str, runs: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        frames = [f for f, _, _ in r["evals"]]
        seconds = [t for _, t, _ in r["evals"]]
        scores = [v for _, _, v in r["evals"]]
        by_frames.plot(frames, scores, marker=".", label=r["name"])
        by_time.plot(seconds, scores, marker=".", label=r["name"])
    for ax, xlabel in ((by_frames, "frames"), (by_time, "wall time (s)")):
        ax.axhline(args.reference, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("greedy score (mean of evaluation games)")
        ax.grid(alpha=0.3)
    by_frames.legend(fontsize=8)
    fig.suptitle(f"{experiment} on {args.env}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=(*EXPERIMENTS, "all"))
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each run")
    parser.add_argument("--frames", type=int, default=None, help="frame budget of each run (stops at either)")
    parser.add_argument("--workers", default="1,2,4,8,16", help="a3c: worker counts")
    parser.add_argument("--learners", default="4,8", help="gala: learner counts")
    parser.add_argument("--actors", type=int, default=14, help="apex: actors")
    parser.add_argument("--envs", type=int, default=16, help="ppo: env workers")
    parser.add_argument("--device", default="auto", help="ppo and apex: the learner's device")
    parser.add_argument("--reference", type=float, default=None, help="the score whose first reaching is timed")
    parser.add_argument("--eval-every", type=int, default=None, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="folder for the runs, summary and curves")
    args = parser.parse_args()
    args.workers = counts(parser, "--workers", args.workers)
    args.learners = counts(parser, "--learners", args.learners)
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    if args.frames is not None and args.frames < 1:
        parser.error(f"--frames must be >= 1, got {args.frames}")
    if args.reference is None:
        if args.env not in REFERENCE:
            parser.error(f"no reference score known for {args.env}: give --reference")
        args.reference = REFERENCE[args.env]

    from rlfleet.envs import env_spec_info

    info = env_spec_info(args.env)  # an unknown id or a missing extra: one error before any run
    args.frame_skip = 4 if info["is_atari"] else 1
    if args.eval_every is None:
        args.eval_every = 100_000 if info["is_atari"] else 10_000
    args.experiments = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    out = args.out or Path(tempfile.mkdtemp(prefix="atari-scale-"))
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} is a file, not a folder")
    earlier = earlier_summary(parser, args, out)
    out.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"machine": machine(), "env": args.env, "minutes": args.minutes, "frames": args.frames,
                                "reference": args.reference, "experiments": {}}  # fmt: skip
    text = ""
    for experiment in args.experiments:
        runs: list[dict[str, Any]] = []
        for run in RUNNERS[experiment](args, out):
            runs.append(run)
            done = {**earlier, **document["experiments"], experiment: runs}
            document["experiments"] = {e: done[e] for e in EXPERIMENTS if e in done}  # in the order of `all`
            text = write_summary(document, args, out)  # after each run: a crash or a timeout loses little
        plot(experiment, runs, args, out / f"curves_{experiment}.png")
    print(text)
    print(f"[atari_scale] wrote {out}/summary.json, summary.md and curves_*.png", file=sys.stderr)


def write_summary(document: dict[str, Any], args: argparse.Namespace, out: Path) -> str:
    """Write OUT/summary.json and OUT/summary.md (the tables) of the runs so far; the tables' text."""
    (out / "summary.json").write_text(json.dumps(document, indent=1) + "\n")
    markdown = [table(experiment, runs, args) for experiment, runs in document["experiments"].items()]
    m = document["machine"]
    header = f"Machine: {m['cpu']}, {m['cores']} cores, GPU {m['gpu'] or 'none'}; torch {m['torch']}.\n\n"
    (out / "summary.md").write_text(header + "\n".join(markdown))
    return header + "\n".join(markdown)


if __name__ == "__main__":
    main()
