"""The `rlfleet` command: train, eval, collect, plot, list, spaces."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import re
import select
import signal
import sys
import threading
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from rlfleet.fields import MissingExtraError, field_docs, parse_count

USAGE_ERROR = 2
INTERRUPTED = 128 + 2  # as a shell reports a command that SIGINT ended


MAX_STEPS_HELP = (
    "steps an episode may take in an env without a time limit of its own (a greedy policy may loop forever); "
    "an episode cut there counts with the return it had (default: the run's --eval-max-steps, 27000)"
)
CLI_ONLY = ("command", "func", "algo", "set", "resume", "no_progress", "search")


def _given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options on the command line of `train` or `tune` (no defaults: those live in their dataclasses), with
    `--env-kwargs` and the networks' `--*-kwargs` typed."""
    from rlfleet.envs.kwargs import parse_env_kwargs
    from rlfleet.launch import USER_NETS
    from rlfleet.run.config import ConfigError

    given = {k: v for k, v in vars(args).items() if k not in CLI_ONLY}
    if args.no_progress:
        given["progress"] = False
    if "env_kwargs" in given:
        items = given["env_kwargs"]
        if not args.algo and not args.resume and "=" not in items[-1]:  # `--env-kwargs a=1 ppo` took ALGO for an item
            raise ConfigError(
                f"--env-kwargs takes KEY=VALUE items, got {items[-1]!r}: put ALGO first (rlfleet {args.command} ALGO "
                "--env ID --env-kwargs KEY=VALUE ...)"
            )
        given["env_kwargs"] = parse_env_kwargs(items)
    for key in (f"{net}_kwargs" for net in USER_NETS):
        if key in given:
            given[key] = parse_env_kwargs(given[key], "--" + key.replace("_", "-"))
    return given


def _train(args: argparse.Namespace) -> int:
    from rlfleet.launch import train
    from rlfleet.run.config import ConfigError, parse_overrides

    given = _given_options(args)
    if args.resume:  # what may not change must equal the saved run (`resumed_config`): ALGO and --set included
        if args.set:
            given["overrides"] = parse_overrides(args.set)
        result = train(args.algo, resume=args.resume, **given)
    else:
        if not args.algo or "env" not in given:
            raise ConfigError("train needs ALGO and --env ID (or --resume RUN_DIR)")
        result = train(args.algo, overrides=parse_overrides(args.set or []), **given)
    print(outcome(result.result))
    print(f"run folder: {result.run_dir}")
    if result.result.get("exploration_hint"):  # a continuous-control run that never beat doing nothing
        print(result.result["exploration_hint"])
    return 0


def outcome(r: dict[str, typing.Any]) -> str:
    """The line `rlfleet train` ends with, from the run's `result.json` fields `r`."""
    if r["eval_return_mean"] is None:
        steps = f"after {r['env_steps']} steps"
        return f"{r['algo']} on {r['env']}: stopped by {r['stopped_by']} {steps} before any evaluation"
    status = f"solved at step {r['solved_at_step']} ({r['solved_at_s']:.1f} s)" if r["solved"] else "not solved"
    at = r.get("eval_at_step")  # parallel workers may step on after the evaluation that ended the run
    steps = f"after {r['env_steps']} steps" if at in (None, r["env_steps"]) else f"at step {at} of {r['env_steps']}"
    return (
        f"{r['algo']} on {r['env']}: eval return {r['eval_return_mean']:.1f} ± {r['eval_return_std']:.1f} {steps}, "
        f"{status}; stopped by {r['stopped_by']}"
    )


def _tune(args: argparse.Namespace) -> int:
    from rlfleet.run.config import parse_overrides
    from rlfleet.tuning.sweep import tune

    given = _given_options(args)
    if args.set:
        given["overrides"] = parse_overrides(args.set)
    result = tune(args.algo, given.pop("env", None), search=args.search or [], resume=args.resume, **given)
    if result.interrupted:
        print(
            f"rlfleet: the sweep was interrupted; each trial kept its checkpoint: rlfleet tune --resume "
            f"{result.sweep_dir} goes on",
            file=sys.stderr,
        )
        return INTERRUPTED
    if result.best is None:
        print(
            "rlfleet: error: no trial made an evaluation (see trials.csv and the sweep's tune/ folder)", file=sys.stderr
        )
        return 1
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlfleet.run.evaluate import cut_note, evaluate_checkpoint
    from rlfleet.run.logger import json_text

    out = evaluate_checkpoint(
        args.checkpoint, episodes=args.episodes, seed=args.seed, video_dir=args.video, max_steps=args.max_steps
    )
    print(json_text(out, indent=2))
    note = cut_note(out["episodes_cut"], out["episodes"], out["max_steps"], "--max-steps")
    if note:  # beside the JSON, which stays parseable
        print(note, file=sys.stderr)
    return 0


def _collect(args: argparse.Namespace) -> int:
    from rlfleet.run.evaluate import cut_note
    from rlfleet.run.recording import collect_demonstrations

    demos, evaluation = collect_demonstrations(
        args.checkpoint, episodes=args.episodes, seed=args.seed, output=args.output, max_steps=args.max_steps
    )
    returns = demos.episode_returns
    print(
        f"{demos.env}: {len(returns)} episodes, {len(demos)} (obs, act) pairs, return {returns.mean():.1f} ± "
        f"{returns.std():.1f}\ndataset: {args.output}"
    )
    note = cut_note(evaluation.cut, len(returns), evaluation.max_steps, "--max-steps")
    if note:
        print(note)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from rlfleet.run.plot import plot_runs

    print(plot_runs([Path(r) for r in args.runs], args.output))
    return 0


@contextlib.contextmanager
def _run_notes(shown: bool) -> Iterator[None]:
    """While a `train` command runs (`shown`), what a run logs for its user at INFO level goes to stdout as the
    command's own lines: the per-env preset it picked ("preset for ENV: ..."), logged once its configuration has
    passed the checks. Taken away afterwards: a later command in the same process (a test's, a notebook's) writes to
    a stdout of its own, and a `tune` command keeps those lines off its terminal."""
    if not shown:
        yield
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    notes = logging.getLogger("rlfleet.run.config")
    saved = notes.level, notes.propagate
    notes.addHandler(handler)
    notes.setLevel(logging.INFO)
    notes.propagate = False
    try:
        yield
    finally:
        notes.removeHandler(handler)
        notes.level, notes.propagate = saved


def _list(args: argparse.Namespace) -> int:
    from rlfleet.algos import REGISTRY, resolve, summary

    print("algorithms (rlfleet train ALGO):")
    for name in sorted(REGISTRY):
        cls, config_cls, presets, _ = resolve(name)
        doc = summary(name)
        preset_names = ", ".join(sorted(presets)) or "-"
        actions = ", ".join(cls.action_spaces)
        print(f"  {name:<10} {doc}\n  {'':<10} data: {cls.data}; actions: {actions}; presets: {preset_names}")
    from rlfleet.arch import ARCHITECTURES, runner_class
    from rlfleet.optim.shared import OPTIMIZER_CHOICES

    print("\narchitectures (rlfleet train ALGO --arch A [its options]):")
    for name, (_, _, description) in ARCHITECTURES.items():
        options = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(runner_class(name).Options)]
        print(f"  {name:<14} {description}\n  {'':<14} options: {', '.join(options) or '-'}")
    print(f"\nshared-parameter optimizers (--optimizer; algo: the algorithm's own): {', '.join(OPTIMIZER_CHOICES)}")
    from rlfleet.algos.env_presets import all_env_presets

    print("\nper-env presets (picked when --env matches and no --preset is given; --preset ENV uses one elsewhere):")
    for name, envs in all_env_presets().items():
        print(f"  {name:<10} {', '.join(envs)}")
    return 0


def _spaces(args: argparse.Namespace) -> int:
    from rlfleet.algos import algorithm_names, resolve
    from rlfleet.algos.spaces import OBSERVATION_SPACES, POLICY_ACTIONS

    names = args.algos or algorithm_names()
    classes = {name: resolve(name)[0] for name in names}  # an unknown name is one line, before anything is printed
    kinds = [k for k in POLICY_ACTIONS if any(k in cls.action_spaces for cls in classes.values())]
    print("action spaces each algorithm takes (y: yes):")
    print(f"  {'':<10} " + " ".join(f"{k:<13}" for k in kinds))
    for name, cls in classes.items():
        print(f"  {name:<10} " + " ".join(f"{'y' if k in cls.action_spaces else '-':<13}" for k in kinds))
    simple = ", ".join(OBSERVATION_SPACES[:-2])
    print(
        f"\nobservation spaces every algorithm takes: {simple}, and Dict or Tuple of these\n"
        "  Box images (uint8, C x H x W): a CNN (Nature DQN's; MinAtar's under 36 x 36; or --set encoder=mnih2013);\n"
        "  other Boxes: flattened\n"
        "  Discrete: one-hot; MultiDiscrete: one-hots side by side; MultiBinary: its bits\n"
        "  Dict: one encoder per entry (a CNN for each image), their features side by side; Tuple (and Dict inside\n"
        "  Dict): one flat Dict with keys '0', '1', ... ('outer.inner' when nested)\n"
        "  ddpg, td3, sac: images flattened too (their networks are MLPs); obs_norm: the float Box entries"
    )
    return 0


NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^-inf$")
"""What `_Parser` takes for a negative number, not an option: `--stop-return -1e3` too (argparse's own pattern, before
Python 3.13, has no exponent)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (exit 2) like every other error of the command, and a negative
    number in any notation is a value (`NEGATIVE_NUMBER`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"rlfleet: error: {message} (see {self.prog} --help)\n")


def _count(text: str) -> int:
    """An integer option, also written as `1e6`."""
    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    """`train`'s options, made from the dataclasses that declare them (their type, default and docstring): the
    run's `RunConfig`, then each architecture's `Options`, grouped by the architectures that have them. A
    default lives in its dataclass only: options not on the command line are not passed on."""
    from rlfleet.arch import ARCHITECTURES, runner_class
    from rlfleet.run.config import RunConfig

    skip = {"algo", "env_kwargs", "options", "overrides", "progress"}  # ALGO and 3 flags: by hand
    run_group = parser.add_argument_group("run options")
    for f in dataclasses.fields(RunConfig):
        if f.name not in skip:
            extra = f" Architectures: {', '.join(ARCHITECTURES)}." if f.name == "arch" else ""
            _add_field(run_group, RunConfig, f.name, _field_help(RunConfig, f.name) + extra)
    owners: dict[str, list[str]] = {}  # option -> the architectures that have it
    for arch in ARCHITECTURES:
        for f in dataclasses.fields(runner_class(arch).Options):
            owners.setdefault(f.name, []).append(arch)
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, owning in owners.items():
        groups.setdefault(tuple(owning), []).append(name)
    for archs, names in groups.items():
        group = parser.add_argument_group(f"options of {', '.join(archs)}")
        for name in names:
            helps = {arch: _field_help(runner_class(arch).Options, name) for arch in archs}
            docs = {arch: _field_help(runner_class(arch).Options, name, with_default=False) for arch in archs}
            if len(set(helps.values())) == 1:  # one meaning
                text = helps[archs[0]]
            elif len(set(docs.values())) == 1:  # one meaning, defaults of their own: each architecture's
                by_default: dict[str, list[str]] = {}
                for arch in archs:
                    by_default.setdefault(str(_field_default(runner_class(arch).Options, name)), []).append(arch)
                defaults = "; ".join(f"{', '.join(owners)}: {value}" for value, owners in by_default.items())
                text = f"{docs[archs[0]]} (default: {defaults})"
            else:  # architectures that mean different things by one option name: each says its own
                text = " | ".join(f"{arch}: {doc}" for arch, doc in helps.items())
            _add_field(group, runner_class(archs[0]).Options, name, text)


def _count_or_word(text: str) -> int | str:
    """An option that takes a count or a word (`--torch-threads 2`, `--torch-threads auto`); the run checks the word."""
    try:
        return parse_count(text)
    except ValueError:
        return text


def _field_default(cls: type, name: str) -> Any:
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


def _field_help(cls: type, name: str, with_default: bool = True) -> str:
    """The help of the dataclass field `name` of `cls`: its docstring on one line, and its default."""
    doc = " ".join(field_docs(cls).get(name, "").split())
    default = _field_default(cls, name)
    if with_default and not (default is None or default is False or default == "" or default is dataclasses.MISSING):
        doc += f" (default: {default})"  # 0 and 0.0 shown too (`0 in (False,)` is true)
    return doc


def _add_field(group, cls: type, name: str, doc: str) -> None:
    """The option `--field-name` of the dataclass field `name` of `cls`, typed by its annotation."""
    hint = typing.get_type_hints(cls)[name]
    kinds = [t for t in typing.get_args(hint) if t is not type(None)]
    kind = kinds[0] if kinds else hint
    flag = "--" + name.replace("_", "-")
    if kind is bool:
        group.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=doc)
    else:
        convert = _count_or_word if {int, str} <= set(kinds) else {int: _count, float: float}.get(kind, str)
        metavar = {int: "N", float: "X"}.get(kind, name.split("_")[-1].upper())
        group.add_argument(flag, type=convert, default=argparse.SUPPRESS, metavar=metavar, help=doc)


def _add_run_inputs(parser: argparse.ArgumentParser) -> None:
    """`--set`, `--env-kwargs` and the networks of the user's own, which `train` and `tune` take."""
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="set an algorithm config field (see its file)"
    )
    parser.add_argument(
        "--env-kwargs",
        action="extend",
        nargs="+",
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help="keyword arguments of the env (gymnasium.make), one or more per flag, the flag repeatable: "
        "--env-kwargs map_name=8x8 is_slippery=false; values are typed: true/false, numbers, none, 'text', [1, 2]",
    )
    nets = {
        "net": "a network of your own as the encoder: package.module:factory, called with the observation space and "
        "the --net-kwargs, returning a torch module from observations to features [batch, F] (docs/networks.md)",
        "actor-net": "ddpg, td3, sac: a whole actor of your own, called with the observation and action spaces "
        "(docs/networks.md)",
        "critic-net": "ddpg, td3, sac: a whole critic of your own, (observations, actions) to Q, built once per critic",
    }
    for name, text in nets.items():
        parser.add_argument(f"--{name}", default=argparse.SUPPRESS, metavar="MODULE:FACTORY", help=text)
        parser.add_argument(
            f"--{name}-kwargs",
            action="extend",
            nargs="+",
            default=argparse.SUPPRESS,
            metavar="KEY=VALUE",
            help=f"keyword arguments of the --{name} factory, typed as --env-kwargs are",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train an agent")
    t.add_argument("algo", nargs="?", help="algorithm name (see `rlfleet list`)")
    _add_train_options(t)
    _add_run_inputs(t)
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    t.set_defaults(func=_train)

    tu = sub.add_parser(
        "tune",
        help="sweep hyperparameters on Ray Tune (each trial an rlfleet run)",
        description="Sweep an algorithm's hyperparameters on Ray Tune: every trial is an rlfleet run folder under "
        "the sweep folder (docs/tuning.md).",
    )
    tu.add_argument("algo", nargs="?", help="algorithm name (see `rlfleet list`)")
    tu.add_argument(
        "--search",
        action="append",
        metavar="NAME=DIST(ARGS)",
        help="a searched name and its distribution, repeatable: lr=loguniform(1e-4,1e-2), ent_coef=uniform(0,0.02), "
        "rollout_len=randint(32,256) (both ends included), gamma=choice(0.99,0.995); NAME is a config field, a run "
        "option, an architecture option or env_kwargs.KEY",
    )
    from rlfleet.tuning.spec import TuneOptions

    sweep_group = tu.add_argument_group("sweep options")
    for f in dataclasses.fields(TuneOptions):
        if f.name not in ("address", "progress"):  # --address: the train options have it; --no-progress by hand
            _add_field(sweep_group, TuneOptions, f.name, _field_help(TuneOptions, f.name))
    _add_train_options(tu)
    _add_run_inputs(tu)
    tu.add_argument("--resume", metavar="SWEEP_DIR", help="go on with an interrupted sweep (its trials resume too)")
    tu.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    tu.set_defaults(func=_tune)

    e = sub.add_parser("eval", help="evaluate a checkpoint greedily")
    e.add_argument(
        "checkpoint", help="checkpoint file, or run folder (its checkpoints/latest.pt; checkpoints/best.pt: the best)"
    )
    e.add_argument("--episodes", type=_count, default=10, help="greedy episodes, side by side (default: 10)")
    e.add_argument("--seed", type=_count, default=12345, help="episode i's env seed is SEED + i (default: 12345)")
    e.add_argument("--video", metavar="DIR", help="record videos of the episodes into DIR")
    e.add_argument("--max-steps", type=_count, metavar="N", help=MAX_STEPS_HELP)
    e.set_defaults(func=_eval)

    c = sub.add_parser("collect", help="record a checkpoint's greedy episodes as demonstrations for bc")
    c.add_argument("checkpoint", help="checkpoint file, or run folder (its checkpoints/latest.pt)")
    c.add_argument("--episodes", type=_count, default=20, help="greedy episodes to record (default: 20)")
    c.add_argument("--seed", type=_count, default=0, help="episode i's env seed is SEED + i (default: 0)")
    c.add_argument("-o", "--output", required=True, metavar="FILE", help="the .npz to write")
    c.add_argument("--max-steps", type=_count, metavar="N", help=MAX_STEPS_HELP)
    c.set_defaults(func=_collect)

    p = sub.add_parser("plot", help="plot learning curves of run folders")
    p.add_argument("runs", nargs="+", help="run folders")
    p.add_argument("-o", "--output", default="curves.png", help="the image to write (default: curves.png)")
    p.set_defaults(func=_plot)

    ls = sub.add_parser("list", help="list algorithms, presets and architectures")
    ls.set_defaults(func=_list)

    sp = sub.add_parser("spaces", help="which observation and action spaces each algorithm takes")
    sp.add_argument("algos", nargs="*", metavar="ALGO", help="algorithms to show (default: all)")
    sp.set_defaults(func=_spaces)
    return parser


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (`rlfleet list | head` once head has its lines)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll on this platform, or no real standard output
        return False


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """A SIGTERM (`kill`, `timeout`, a scheduler's preemption) outside a run's loop, which stops politely on its own,
    is a Ctrl-C: what the command started goes with it, and it says so in one line."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _out_of_memory(exc: RuntimeError) -> bool:
    """Whether `exc` is torch's word for an allocation that failed (on the CPU, or CUDA's out of memory)."""
    text = str(exc)
    return "can't allocate memory" in text or "out of memory" in text.lower()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rlfleet.algos import UnknownAlgorithmError
    from rlfleet.algos.spaces import UnsupportedSpaceError
    from rlfleet.backends import RunFailure
    from rlfleet.data.demos import DatasetError
    from rlfleet.envs import EnvProcessError, UnknownEnvError
    from rlfleet.run.checkpoint import CheckpointError
    from rlfleet.run.config import ConfigError
    from rlfleet.run.plot import MetricsError

    try:
        with _run_notes(args.command == "train"), _sigterm_as_ctrl_c():
            return args.func(args)
    except BrokenPipeError:  # `rlfleet list | head`: the reader has what it wanted; any other pipe is the command's
        if not _reader_gone():
            raise
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C before a run's loop (which stops politely) or a second one: one line
        print("rlfleet: interrupted", file=sys.stderr)
        return INTERRUPTED
    except (
        UnknownAlgorithmError,
        UnknownEnvError,
        UnsupportedSpaceError,
        ConfigError,
        CheckpointError,
        DatasetError,
        MetricsError,
        MissingExtraError,
    ) as exc:
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except RunFailure as exc:  # stopped cleanly (checkpoint, result.json) by what it could not go on past
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = ""
        if exc.run_dir is not None:
            where = f"; its checkpoint is saved: rlfleet train --resume {exc.run_dir} goes on"
            if (exc.run_dir / "workers.log").exists():
                where += f" (details in {exc.run_dir}/workers.log)"
        print(f"rlfleet: error: the run stopped: {reason}{where}", file=sys.stderr)
        return 1
    except EnvProcessError as exc:  # outside a run (eval, collect): the command's envs are gone, nothing to save
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as exc:  # sizes past what the checks foresee (a network's, a batch's)
        if isinstance(exc, RuntimeError) and not _out_of_memory(exc):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"rlfleet: error: out of memory{f': {first}' if first else ''}", file=sys.stderr)
        return 1
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError) as exc:
        # a path the checks above did not foresee (or that changed under the command): still one line
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
