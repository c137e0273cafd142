#!/usr/bin/env bash
# The project's checks that need a GPU machine, most valuable first, each bounded by its own timeout. Output: the
# terminal and $OUT/device_checks.log (with OUT unset: ./device-out). Packages the GPU machine lacks (gymnasium,
# ale-py, mujoco, stable-baselines3, imageio) come as wheels in .whl/ (docs/devices.md, "Measured", says how they
# are fetched).
#
#     bash benchmarks/device_checks.sh tests sac updates  # what is still pending, most valuable first (~10 min)
#     bash benchmarks/device_checks.sh pong_ppo           # one step; every step, in this order:
#         tests (4 min) sac (4) updates (2.5) learning (3) pong_ppo (8) a3c_pong (8.5) a3c_numa (2.5) a3c_perf (4.5)
#         apex_pong (5) gala_pong (9)
# A module or env the steps need that is missing stops it at once (exit 3); a step that fails or runs out of time is
# named at the end, and the exit status is then 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_checks.log") 2>&1
export PYTHONUNBUFFERED=1 MUJOCO_GL=disable  # no rendering: MuJoCo imports no OpenGL
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
steps=${*:-tests sac updates}
wanted() { [[ " $steps " == *" $1 "* ]]; }
current="machine"
failed=""
step() { current=${1%%:*}; echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
check() {  # run a step's command; a failure (124: its timeout) is noted against the step
    "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "FAILED (exit $rc): $current"
        failed="$failed $current"
    fi
}

step "machine"
nvidia-smi -L
nproc
STEPS="$steps" python3 - << 'EOF' || { echo "the steps cannot run here: nothing was measured"; exit 3; }
import importlib, os, sys, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
# what the steps import, and the envs they make: one missing shows here, named, rather than as a failure in every step
needed = ["numpy", "gymnasium", "ale_py", "cv2", "mujoco", "imageio", "packaging", "tqdm", "torch.utils.tensorboard",
          "matplotlib", "pytest", "xdist", "pandas", "cloudpickle"]
if "sac" in os.environ["STEPS"].split():
    needed.append("stable_baselines3")
found, missing = [], []
for name in needed:
    try:
        found.append(f"{name} {getattr(importlib.import_module(name), '__version__', '')}".strip())
    except Exception as e:  # an ImportError, or a package that fails as it loads
        missing.append(f"{name} ({type(e).__name__}: {e})")
if not missing:
    from rlfleet.envs import make_env
    for env_id in ("CartPole-v1", "HalfCheetah-v5", "ALE/Pong-v5"):
        try:
            make_env(env_id, seed=0).close()
        except Exception as e:  # the env's own code may raise anything
            missing.append(f"the env {env_id} ({type(e).__name__}: {e})")
print("found:", ", ".join(found))
print("MISSING:", "; ".join(missing) if missing else "none")
sys.exit(1 if missing else 0)
EOF

if wanted tests; then
    step "tests: the gpu test module, without its learning runs"
    check timeout 270 python3 -m pytest tests/gpu -m "gpu and not learning" -p no:cacheprovider -v --durations=8
fi
if wanted sac; then
    step "sac: SAC on HalfCheetah-v5, 20,000 steps, rlfleet (its update a CUDA graph) and SB3, learners on the GPU"
    check timeout 240 python3 benchmarks/device_learner.py sac --seeds 0 1 --out "$OUT/device_sac.json"
fi
if wanted updates; then
    step "updates: learner updates per second, CPU against GPU (the table behind --device auto)"
    check timeout 150 python3 benchmarks/device_learner.py updates --repeats 3 --out "$OUT/device_updates.json"
fi
if wanted learning; then
    step "learning: the gpu test module's learning runs"
    check timeout 180 python3 -m pytest tests/gpu -m "gpu and learning" -p no:cacheprovider -q --durations=8 -rA
fi
if wanted pong_ppo; then
    step "pong_ppo: PPO on Pong, learner on the GPU, 16 env processes, 7 minutes (goal: >= 18 within 10)"
    check timeout 540 python3 benchmarks/atari_scale.py ppo --env ALE/Pong-v5 --minutes 7 --device cuda --envs 16 \
        --eval-every 250000 --eval-episodes 5 --out "$OUT/pong_ppo"
fi
if wanted a3c_pong; then
    step "a3c_pong: A3C on Pong at 1, 2, 4, 8 and 16 workers, 78 s each: frames/s, time to -15, ms per phase"
    lscpu | grep -i -E "^(socket|core|thread|numa)"
    check timeout 600 python3 benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 1.3 --workers 1,2,4,8,16 \
        --eval-every 100000 --eval-episodes 3 --out "$OUT/a3c_pong"
fi
if wanted a3c_numa; then
    step "a3c_numa: 16 A3C workers on the first NUMA node's cores only, against all cores (a3c_pong's row)"
    node0=$(lscpu -p=CPU,NODE | grep -v '^#' | awk -F, '$2 == 0 {print $1}' | paste -sd,)
    nodes=$(lscpu -p=NODE | grep -v '^#' | sort -u | wc -l)
    echo "node 0 cpus: $node0 ($nodes NUMA nodes)"
    if [ "$nodes" -gt 1 ]; then
        check timeout 240 taskset -c "$node0" python3 benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 1.3 \
            --workers 16 --eval-every 1000000 --eval-episodes 1 --out "$OUT/a3c_numa"
    else
        echo "one NUMA node: its cores are all the cores, and a3c_pong's 16-worker row is this run"
    fi
fi
if wanted a3c_perf; then
    step "a3c_perf: hardware counters of the whole machine (perf stat, 15 s) while A3C runs on Pong at 8, then 16 workers"
    if command -v perf > /dev/null; then
        for n in 8 16; do
            timeout 130 python3 benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 1.2 --workers "$n" \
                --eval-every 100000000 --eval-episodes 1 --out "$OUT/a3c_perf_$n" > "$OUT/a3c_perf_$n.log" 2>&1 &
            run=$!
            sleep 40  # the workers started and stepping
            echo "--- $n workers"
            timeout 30 perf stat -a -e cycles,instructions,cache-references,cache-misses,LLC-load-misses,context-switches \
                -- sleep 15 2>&1 | grep -v "^$"
            check wait "$run"
            tail -4 "$OUT/a3c_perf_$n/summary.md" 2>/dev/null
        done
    else
        echo "no perf on this machine"
    fi
fi
if wanted apex_pong; then
    step "apex_pong: Ape-X DQN on Pong, 14 actors, the unpaced learner on the GPU, 4 minutes"
    check timeout 330 python3 benchmarks/atari_scale.py apex --env ALE/Pong-v5 --minutes 4 --actors 14 --device cuda \
        --eval-every 250000 --eval-episodes 3 --out "$OUT/apex_pong"
fi
if wanted gala_pong; then
    step "gala_pong: GALA with 4 and 8 learners (90 s each), then A2C at equal frames (at most 3 minutes), on Pong"
    check timeout 600 python3 benchmarks/atari_scale.py gala --env ALE/Pong-v5 --minutes 1.5 --learners 4,8 \
        --eval-every 250000 --eval-episodes 3 --out "$OUT/gala_pong"
fi
step "done"
if [ -n "$failed" ]; then
    echo "failed steps:$failed"
    exit 1
fi
