"""The `rlfleet` command: train, eval, collect, plot, list."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from rlfleet.fields import parse_count

USAGE_ERROR = 2


def _train(args: argparse.Namespace) -> int:
    from rlfleet.run.config import ConfigError, parse_overrides
    from rlfleet.run.train import train

    options = dict(
        steps=args.steps,
        time_limit=args.time_limit,
        progress=not args.no_progress,
    )
    if args.resume:
        result = train(resume=args.resume, **{k: v for k, v in options.items() if v is not None})
    else:
        if not args.algo or not args.env:
            raise ConfigError("train needs ALGO and --env ID (or --resume RUN_DIR)")
        result = train(
            args.algo,
            args.env,
            seed=args.seed,
            n_envs=args.n_envs,
            preset=args.preset,
            overrides=parse_overrides(args.set or []),
            logdir=args.logdir,
            name=args.name,
            eval_every=args.eval_every,
            eval_episodes=args.eval_episodes,
            stop_return=args.stop_return,
            checkpoint_every=args.checkpoint_every,
            vector_mode=args.vector_mode,
            arch=args.arch,
            workers=args.workers,
            optimizer=args.optimizer,
            grad_sets=args.grad_sets,
            torch_threads=args.torch_threads,
            serial=args.serial,
            max_restarts=args.max_restarts,
            dataset=args.dataset,
            expert=args.expert,
            **options,
        )
    r = result.result
    if r["eval_return_mean"] is None:
        print(
            f"{r['algo']} on {r['env']}: stopped by {r['stopped_by']} after {r['env_steps']} steps before any "
            f"evaluation\nrun folder: {result.run_dir}"
        )
        return 0
    status = f"solved at step {r['solved_at_step']} ({r['solved_at_s']:.1f} s)" if r["solved"] else "not solved"
    print(
        f"{r['algo']} on {r['env']}: eval return {r['eval_return_mean']:.1f} ± {r['eval_return_std']:.1f} "
        f"after {r['env_steps']} steps, {status}; stopped by {r['stopped_by']}\nrun folder: {result.run_dir}"
    )
    if r.get("exploration_hint"):  # a continuous-control run that never beat doing nothing
        print(r["exploration_hint"])
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlfleet.run.evaluate import evaluate_checkpoint

    out = evaluate_checkpoint(args.checkpoint, episodes=args.episodes, seed=args.seed, video_dir=args.video)
    print(json.dumps(out, indent=2))
    return 0


def _collect(args: argparse.Namespace) -> int:
    from rlfleet.run.collect import collect_demonstrations

    demos = collect_demonstrations(args.checkpoint, episodes=args.episodes, seed=args.seed, output=args.output)
    returns = demos.episode_returns
    print(
        f"{demos.env}: {len(returns)} episodes, {len(demos)} (obs, act) pairs, return {returns.mean():.1f} ± "
        f"{returns.std():.1f}\ndataset: {args.output}"
    )
    return 0


def _plot(args: argparse.Namespace) -> int:
    from rlfleet.run.plot import plot_runs

    print(plot_runs([Path(r) for r in args.runs], Path(args.output)))
    return 0


def _show_run_notes() -> None:
    """What a run logs for its user at INFO level goes to stdout as the command's own lines: the per-env preset
    it picked ("preset for ENV: ..."), logged once its configuration has passed the checks."""
    import logging

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    notes = logging.getLogger("rlfleet.run.config")
    notes.addHandler(handler)
    notes.setLevel(logging.INFO)
    notes.propagate = False


def _list(args: argparse.Namespace) -> int:
    from rlfleet.algos import REGISTRY, resolve

    print("algorithms (rlfleet train ALGO):")
    for name in sorted(REGISTRY):
        cls, config_cls, presets, _ = resolve(name)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        preset_names = ", ".join(sorted(presets)) or "-"
        print(f"  {name:<10} {doc}\n  {'':<10} data: {cls.data}; presets: {preset_names}")
    from rlfleet.arch import ARCHITECTURES
    from rlfleet.optim import HOGWILD_OPTIMIZERS

    print("\narchitectures (rlfleet train ALGO --arch A --workers N):")
    for name, (_, _, description) in ARCHITECTURES.items():
        print(f"  {name:<14} {description}")
    print(f"\nshared-parameter optimizers (--optimizer): {', '.join(HOGWILD_OPTIMIZERS)}")
    from rlfleet.algos.env_presets import all_env_presets

    print("\nper-env presets (picked when --env matches and no --preset is given; --preset ENV uses one elsewhere):")
    for name, envs in all_env_presets().items():
        print(f"  {name:<10} {', '.join(envs)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (exit 2) like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"rlfleet: error: {message} (see {self.prog} --help)\n")


def _count(text: str) -> int:
    """An integer option, also written as `1e6`."""
    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train an agent")
    t.add_argument("algo", nargs="?", help="algorithm name (see `rlfleet list`)")
    t.add_argument("--env", help="Gymnasium env id, e.g. CartPole-v1 or ALE/Pong-v5")
    t.add_argument("--steps", type=_count, help="env steps to train (default: the algorithm's total_steps)")
    t.add_argument("--seed", type=_count, default=0)
    t.add_argument("--n-envs", type=_count, help="parallel training envs")
    t.add_argument("--preset", help="named defaults of the algorithm (see `rlfleet list`)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="set an algorithm config field")
    t.add_argument("--logdir", default="runs", help="folder of run folders (default: runs)")
    t.add_argument("--name", help="run folder name")
    t.add_argument("--eval-every", type=_count, help="env steps between greedy evaluations")
    t.add_argument("--eval-episodes", type=_count, default=10)
    t.add_argument("--stop-return", type=float, help="stop when evaluation reaches this (default: env threshold)")
    t.add_argument("--time-limit", type=float, help="wall-clock seconds this invocation trains at most")
    t.add_argument("--checkpoint-every", type=_count, help="env steps between checkpoints")
    t.add_argument("--vector-mode", default="auto", choices=["auto", "sync", "async", "envpool"])
    t.add_argument(
        "--arch", help="architecture: single, hogwild, data_parallel, grad_parallel, offline (default: the algorithm's)"
    )
    t.add_argument("--workers", type=_count, default=2, help="worker processes of a parallel architecture (default: 2)")
    t.add_argument(
        "--optimizer",
        default="shared_rmsprop",
        help="optimizer of shared parameters: shared_rmsprop (default), rmsprop, momentum_sgd, shared_adam",
    )
    t.add_argument(
        "--grad-sets",
        type=_count,
        default=0,
        help="gradient sets grad_parallel sums per step (default 0: one per worker)",
    )
    t.add_argument(
        "--max-restarts", type=_count, default=10, help="worker restarts a parallel run allows in all (default: 10)"
    )
    t.add_argument("--serial", action="store_true", help="run a parallel architecture's workers in one process")
    t.add_argument("--dataset", metavar="FILE", help="demonstrations for bc (written by `rlfleet collect`)")
    t.add_argument("--expert", metavar="CHECKPOINT", help="bc: DAgger, the expert labels the learner's states")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--torch-threads", type=_count, default=1, help="torch threads of the training process (default 1)")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="evaluate a checkpoint greedily")
    e.add_argument("checkpoint", help="checkpoint file or run folder")
    e.add_argument("--episodes", type=_count, default=10)
    e.add_argument("--seed", type=_count, default=12345)
    e.add_argument("--video", metavar="DIR", help="record videos of the episodes into DIR")
    e.set_defaults(func=_eval)

    c = sub.add_parser("collect", help="record a checkpoint's greedy episodes as demonstrations for bc")
    c.add_argument("checkpoint", help="checkpoint file or run folder")
    c.add_argument("--episodes", type=_count, default=20)
    c.add_argument("--seed", type=_count, default=0)
    c.add_argument("-o", "--output", required=True, metavar="FILE", help="the .npz to write")
    c.set_defaults(func=_collect)

    p = sub.add_parser("plot", help="plot learning curves of run folders")
    p.add_argument("runs", nargs="+", help="run folders")
    p.add_argument("-o", "--output", default="curves.png")
    p.set_defaults(func=_plot)

    ls = sub.add_parser("list", help="list algorithms, presets and architectures")
    ls.set_defaults(func=_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rlfleet.algos import UnknownAlgorithmError
    from rlfleet.algos.common import UnsupportedSpaceError
    from rlfleet.data.demos import DatasetError
    from rlfleet.envs import UnknownEnvError
    from rlfleet.run.checkpoint import CheckpointError
    from rlfleet.run.config import ConfigError
    from rlfleet.run.plot import MetricsError

    try:
        if args.command == "train":
            _show_run_notes()
        return args.func(args)
    except (
        UnknownAlgorithmError,
        UnknownEnvError,
        UnsupportedSpaceError,
        ConfigError,
        CheckpointError,
        DatasetError,
        MetricsError,
    ) as exc:
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError) as exc:
        # a path the checks above did not foresee (or that changed under the command): still one line
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
