"""The benchmark scripts under `benchmarks/`: their options (a bad one is a one-line usage error, not a traceback),
their results files (`--resume` continues a benchmark with its own options; a throughput-only session keeps the
other table), how times are counted (a solve past the time limit is none, for every framework; an unsolved seed
counts as the limit), rlfleet's records (every evaluation listed), and stopping a driver with SIGTERM (nothing it
started is left running)."""

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import kill_session, session_processes

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """Loads a script of `benchmarks/` as a module (with `benchmarks/` on the path, as when it is run)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))

    def load(name: str):
        module_name = "bench_" + name.replace("/", "_")
        spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, module_name, module)
        spec.loader.exec_module(module)
        return module

    return load


def usage_error(parse, argv: list[str], capsys) -> str:
    """The one error line of a refused command line (argparse: usage, then `prog: error: ...`, exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


# --- bad options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seeds", "0"], "--seeds must be at least 1, got 0"),
        (["--seeds", "-1"], "--seeds must be at least 1, got -1"),
        (["--time-limit", "-5"], "--time-limit must be a positive number of seconds, got -5"),
        (["--time-limit", "0"], "--time-limit must be a positive number of seconds, got 0"),
    ],
)
def test_time_to_solve_refuses_no_seeds_and_no_time(bench, capsys, tmp_path, argv, says):
    tts = bench("time_to_solve")
    assert says in usage_error(tts.parse_args, [*argv, "--out", str(tmp_path / "r.json")], capsys)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("script", "argv", "says"),
    [
        ("hogwild_scaling", ["--workers", "a"], "--workers: expected comma-separated worker counts, got 'a'"),
        ("hogwild_scaling", ["--workers", "1,0"], "--workers: worker counts must be at least 1"),
        ("hogwild_scaling", ["--methods", "foo"], "--methods: expected a comma-separated subset of a3c,nstep_q"),
        ("hogwild_scaling", ["--seeds", "0"], "--seeds must be at least 1"),
        ("hogwild_scaling", ["--repeats", "0"], "--repeats must be at least 1"),
        ("hogwild_scaling", ["--time-limit", "-1"], "--time-limit must be a positive number of seconds"),
        ("parallel_throughput", ["--archs", "foo"], "--archs: expected a comma-separated subset of single,hogwild"),
        ("parallel_throughput", ["--backends", "rai"], "--backends: expected a comma-separated subset of serial"),
        ("parallel_throughput", ["--steps", "0"], "--steps must be at least 1"),
        ("parallel_throughput", ["--workers", "0"], "--workers must be at least 1"),
        ("collect_throughput", ["--steps", "0"], "--steps must be at least 8, got 0"),
        ("collect_throughput", ["--repeats", "0"], "--repeats must be at least 1, got 0"),
        ("weight_publish", ["--trials", "0"], "--trials must be at least 1, got 0"),
        ("weight_publish", ["--backends", "foo"], "--backends: expected a comma-separated subset of serial"),
        ("gossip", ["--configs", "gala4"], "--configs: unknown 'gala4'; runs are a2c, a3c, gala-K"),  # not a2c
        ("gossip", ["--configs", "a2c,local-pala-1"], "--configs: unknown 'local-pala-1'"),
        ("gossip", ["--learners", "2,x"], "--learners takes comma-separated counts, got '2,x'"),
        ("gossip", ["--learners", "1"], "--learners takes counts >= 2"),
    ],
)
def test_bad_options_are_one_line_errors(bench, capsys, script, argv, says):
    assert says in usage_error(bench(script).parse_args, argv, capsys)


def test_gossip_runs_the_configs_it_is_given(bench):
    args = bench("gossip").parse_args(["--configs", "a2c,gala-4,pala-8", "--learners", "2"])
    assert args.config_list == ["a2c", "gala-4", "pala-8"] and args.ks == [4, 8] and not args.no_pala
    args = bench("gossip").parse_args(["--learners", "2,4", "--no-pala"])
    assert args.config_list == ["a2c", "a3c", "gala-2", "gala-4", "local-pala-2", "local-pala-4"]


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("time_to_solve", ["--seeds", "0"]),
        ("hogwild_scaling", ["--methods", "foo"]),
        ("weight_publish", ["--trials", "0"]),
    ],
)
def test_a_script_run_with_a_bad_option_says_so_in_one_line(tmp_path, script, argv):
    """As a command: exit status 2, the usage and one error line, nothing written."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *argv, "--out", str(tmp_path / "r.json")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len([line for line in done.stderr.splitlines() if "error:" in line]) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_throughput_scripts_write_under_benchmarks_results_wherever_they_are_run(bench):
    """Not under the working folder's `benchmarks/results/`, which need not be this checkout's."""
    assert bench("hogwild_scaling").parse_args([]).out == BENCHMARKS / "results" / "hogwild_scaling.json"
    assert bench("collect_throughput").parse_args([]).out == BENCHMARKS / "results" / "throughput.json"


# --- results files -----------------------------------------------------------------------------------


def cartpole_document(runs: list[dict]) -> dict:
    """A results file of time_to_solve.py as the full CartPole-v1 benchmark writes it (no a3c)."""
    config = {"algos": ["ppo", "a2c", "dqn", "pg"], "env": None, "frameworks": ["rlfleet", "sb3", "tianshou"],
              "seeds": 5, "time_limit_s": 300.0}  # fmt: skip
    return {"benchmark": "time-to-solve CartPole-v1", "config": config, "machine": {}, "started": "", "runs": runs}


def test_resume_continues_the_benchmark_with_the_files_options(bench, capsys, tmp_path):
    tts = bench("time_to_solve")
    out = tmp_path / "cartpole.json"
    out.write_text(json.dumps(cartpole_document([])))
    args = tts.parse_args(["--seeds", "5", "--resume", "--out", str(out)])  # benchmarks/README.md's command
    assert args.algos == ["ppo", "a2c", "dqn", "pg"] and args.env is None
    assert args.frameworks == ["rlfleet", "sb3", "tianshou"] and args.time_limit == 300.0 and args.seeds == 5
    args = tts.parse_args(["--resume", "--out", str(out), "--seeds", "7", "--algos", "ppo,a2c,dqn,pg"])
    assert args.seeds == 7 and args.algos == ["ppo", "a2c", "dqn", "pg"]  # more seeds: allowed
    refused = {
        "--algos": "was run with --algos ppo,a2c,dqn,pg, not ppo,a3c",
        "--frameworks": "was run with --frameworks rlfleet,sb3,tianshou, not rlfleet",
        "--time-limit": "was run with --time-limit 300, not 60",
        "--env": "was run with --env (none: each algo on its own env), not Pendulum-v1",
        "--seeds": "has 5 seeds: --seeds may add seeds, not leave some out",
    }
    values = {"--algos": "ppo,a3c", "--frameworks": "rlfleet", "--time-limit": "60", "--env": "Pendulum-v1",
              "--seeds": "3"}  # fmt: skip
    for option, says in refused.items():
        assert says in usage_error(tts.parse_args, ["--resume", "--out", str(out), option, values[option]], capsys)
    # without --resume, or with a file not there yet, the options are the defaults as ever
    assert tts.parse_args(["--out", str(out)]).algos == ["ppo", "a2c", "dqn", "pg", "a3c"]
    assert tts.parse_args(["--resume", "--out", str(tmp_path / "new.json")]).algos[-1] == "a3c"


def test_resume_runs_failed_runs_again(bench, tmp_path):
    tts = bench("time_to_solve")
    out = tmp_path / "cartpole.json"
    done = {"framework": "rlfleet", "algo": "pg", "env": "CartPole-v1", "seed": 0, "solved": True, "solved_at_s": 1.0}
    failed = {**done, "framework": "tianshou", "solved": False, "error": "exit status 1", "log": "x.log"}
    document = cartpole_document([done, failed])
    out.write_text(json.dumps(document))
    args = tts.parse_args(["--resume", "--out", str(out), "--seeds", "5"])
    args.algos, args.seeds = ["pg"], 1
    assert tts.plan_runs(args, document) == [(0, "pg", "CartPole-v1", "tianshou")]  # sb3 has no pg
    assert document["runs"] == [done]


def test_a_throughput_only_session_keeps_the_speedup_table(bench, tmp_path):
    hogwild = bench("hogwild_scaling")
    out = tmp_path / "hogwild_scaling.json"
    speedup = {"a3c": {"1": {"runs": [], "median_s": 8.8, "solved": 3}}}
    out.write_text(json.dumps({"machine": {"cores": 2}, "started": "then", "speedup": speedup, "throughput": {"x": 1}}))
    document = hogwild.start_document(hogwild.parse_args(["--only", "throughput", "--out", str(out)]))
    assert document["speedup"] == speedup and document["machine"] == {"cores": 2} and document["started"] == "then"
    assert document["throughput"] == {} and document["throughput_args"]["only"] == "throughput"
    assert set(document["throughput_machine"]) == {"cpu", "cores", "python"}
    fresh = hogwild.start_document(hogwild.parse_args(["--out", str(out)]))  # both tables: a new document
    assert fresh["speedup"] == {} and "throughput_args" not in fresh


# --- how times are counted -------------------------------------------------------------------------


def test_a_peer_solving_past_the_time_limit_has_not_solved(bench, monkeypatch):
    common = bench("peers/common")
    tracker = common.Tracker("CartPole-v1", time_limit_s=5.0, step_limit=100_000)
    tracker.start()
    monkeypatch.setattr(tracker, "elapsed", lambda: 6.7)
    assert tracker.record(4_000, 500.0) is True
    result = tracker.result(framework="sb3", version="x", algo="ppo", seed=0, env_steps=4_000, libraries={})
    assert not result.solved and result.solved_at_s is None and result.stop_reason == "time_limit"
    monkeypatch.setattr(tracker, "elapsed", lambda: 4.9)
    assert tracker.record(6_000, 500.0) is True and tracker.stop_reason == "solved"


def test_rlfleet_solving_past_the_time_limit_has_not_solved(bench):
    runner = bench("rlfleet_runner")
    result = {"solved": True, "solved_at_s": 6.7, "solved_at_step": 4_000, "env_steps": 4_000, "wall_time_s": 6.8,
              "eval_return_mean": 500.0}  # fmt: skip
    record = runner.to_run_result({"framework": "rlfleet", "version": "x", "algo": "pg", "env": "CartPole-v1",
                                   "seed": 0, "libraries": {}}, 5.0, result, [(4_000, 6.7, 500.0)])  # fmt: skip
    assert not record.solved and record.solved_at_s is None and record.stop_reason == "time_limit"


def test_the_table_counts_a_solve_past_the_limit_as_the_limit(bench):
    tts = bench("time_to_solve")
    late = {"framework": "tianshou", "algo": "pg", "env": "CartPole-v1", "seed": 0, "solved": True,
            "solved_at_s": 6.7, "solved_at_step": 4_594, "version": "2.0.1"}  # fmt: skip
    unsolved = {**late, "framework": "rlfleet", "version": "0.1.0", "solved": False, "solved_at_s": None}
    document = cartpole_document([late, unsolved])
    document["machine"] = {"cpu_model": "c", "cpu_cores": 2, "python": "3", "load_average_at_start": [0, 0, 0]}
    document["config"].update(algos=["pg"], frameworks=["rlfleet", "tianshou"], seeds=1, time_limit_s=5.0)
    table = tts.summarize(document)
    assert "| pg | tianshou | 2.0.1 | 5.0* | 5.0–5.0* | – | 0/1 |" in table
    assert "| pg | rlfleet | 0.1.0 | 5.0* | 5.0–5.0* | – | 0/1 | 1.00× (tianshou) |" in table
    assert "A run that solved only past the time limit counts as not solved." in table


def test_hogwild_speedup_counts_an_unsolved_seed_as_the_time_limit(bench):
    hogwild = bench("hogwild_scaling")
    solved = {"solved": True, "seconds": 3.0, "steps": 10_000}
    unsolved = {"solved": False, "seconds": None, "steps": None}
    late = {"solved": True, "seconds": 12.0, "steps": 30_000}
    assert hogwild.speedup_row([solved, unsolved], 10.0) == {"runs": [solved, unsolved], "median_s": 6.5, "solved": 1}
    assert hogwild.speedup_row([unsolved, late], 10.0)["median_s"] == 10.0
    assert hogwild.speedup_row([late], 10.0)["solved"] == 0


# --- real runs ---------------------------------------------------------------------------------------


def test_an_rlfleet_record_lists_every_evaluation(tmp_path):
    """From the run's `metrics.csv`: the solving evaluation is the last one, at `solved_at_step` and `solved_at_s`."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "rlfleet_runner.py"), "--algo", "pg", "--seed", "0",
                           "--time-limit", "120", "--logdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.splitlines()[-1])
    evals = record["evals"]
    assert evals, record
    assert [step for step, _, _ in evals] == sorted({step for step, _, _ in evals})
    last_step, last_s, last_return = evals[-1]
    assert last_return == pytest.approx(record["eval_return_mean"], rel=1e-5)
    if record["solved"]:
        assert last_step == record["solved_at_step"] and last_s == pytest.approx(record["solved_at_s"], abs=1e-3)
    assert all(b[1] >= a[1] for a, b in zip(evals, evals[1:], strict=False))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def test_sigterm_stops_the_driver_and_everything_it_started(tmp_path):
    """A driver stopped by SIGTERM (`kill`, `timeout`) kills its runner's process group, as on Ctrl-C: the runner,
    `rlfleet train` and its hogwild workers (each runner has a session of its own, which the signal does not
    reach)."""
    command = [sys.executable, str(BENCHMARKS / "time_to_solve.py"), "--env", "Pendulum-v1", "--algos", "a3c",
               "--frameworks", "rlfleet", "--seeds", "1", "--time-limit", "60", "--out",
               str(tmp_path / "r.json")]  # fmt: skip
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runner_sid = None
    try:
        deadline = time.monotonic() + 300
        started: dict[int, tuple[str, str]] = {}
        while time.monotonic() < deadline and driver.poll() is None:
            for pid in children(driver.pid):
                with contextlib.suppress(OSError):
                    if os.getsid(pid) == pid:
                        runner_sid = pid
            started = session_processes(runner_sid) if runner_sid else {}
            # the runner, `rlfleet train`, multiprocessing's resource tracker and the 2 workers: the run is going
            if sum("multiprocessing" in cmd for _, cmd in started.values()) >= 3:
                break
            time.sleep(0.5)
        assert driver.poll() is None and runner_sid is not None, driver.stderr.read() if driver.stderr else ""
        assert any("rlfleet train a3c" in cmd or " train a3c " in cmd for _, cmd in started.values()), started
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=120)
        assert driver.returncode == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while (left := [pid for pid in started if alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, {pid: started[pid] for pid in left}
        assert not session_processes(runner_sid)
    finally:
        driver.kill()
        driver.wait()
        if runner_sid is not None:
            kill_session(runner_sid)
