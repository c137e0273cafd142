#!/usr/bin/env bash
# The project's checks that need a GPU machine, most valuable first, each bounded by its own timeout. Output: the
# terminal and $OUT/device_checks.log (with OUT unset: ./device-out). Packages the GPU machine lacks (gymnasium,
# ale-py, mujoco, stable-baselines3) come as wheels in .whl/ (docs/devices.md, "Measured", says how they are fetched).
#
#     bash benchmarks/device_checks.sh tests sac updates  # what is still pending, most valuable first (~10 min)
#     bash benchmarks/device_checks.sh pong_ppo           # one step; every step, in this order:
#         tests (4 min) sac (4) updates (2.5) learning (3) pong_ppo (8) a3c_pong (9) a3c_numa (2.5) a3c_perf (3.5)
#         apex_pong (5) gala_pong (9)
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
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi -L
nproc
python3 - << 'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
# what the steps import: one missing shows here, named, rather than as a failure in every step
needed = ["numpy", "gymnasium", "ale_py", "cv2", "mujoco", "tqdm", "torch.utils.tensorboard", "matplotlib", "pytest",
          "xdist", "stable_baselines3", "pandas", "cloudpickle"]
found, missing = [], []
for name in needed:
    try:
        found.append(f"{name} {getattr(importlib.import_module(name), '__version__', '')}".strip())
    except Exception as e:  # an ImportError, or a package that fails as it loads
        missing.append(f"{name} ({type(e).__name__}: {e})")
print("found:", ", ".join(found))
print("MISSING:", "; ".join(missing) if missing else "none")
EOF

if wanted tests; then
    step "tests: the gpu test module, without its learning runs"
    timeout 270 python3 -m pytest tests/gpu -m "gpu and not learning" -p no:cacheprovider -v --durations=8
fi
if wanted sac; then
    step "sac: SAC on HalfCheetah-v5, 20,000 steps, rlfleet (its update a CUDA graph) and SB3, learners on the GPU"
    timeout 240 python3 benchmarks/device_learner.py sac --seeds 0 1 --out "$OUT/device_sac.json"
fi
if wanted updates; then
    step "updates: learner updates per second, CPU against GPU (the table behind --device auto)"
    timeout 150 python3 benchmarks/device_learner.py updates --repeats 3 --out "$OUT/device_updates.json"
fi
if wanted learning; then
    step "learning: the gpu test module's learning runs"
    timeout 180 python3 -m pytest tests/gpu -m "gpu and learning" -p no:cacheprovider -q --durations=8 -rA
fi
if wanted pong_ppo; then
    step "pong_ppo: PPO on Pong, learner on the GPU, 16 env processes, 7 minutes (goal: >= 18 within 10)"
    timeout 540 python3 benchmarks/atari_scale.py ppo --env ALE/Pong-v5 --minutes 7 --device cuda --envs 16 \
        --eval-every 250000 --eval-episodes 5 --out "$OUT/pong_ppo"
fi
if wanted a3c_pong; then
    step "a3c_pong: A3C on Pong at 1, 2, 4, 8 and 16 workers, 100 s each: frames/s, time to -15, ms per phase"
    lscpu | grep -i -E "^(socket|core|thread|numa)"
    timeout 600 python3 benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 1.67 --workers 1,2,4,8,16 \
        --eval-every 100000 --eval-episodes 3 --out "$OUT/a3c_pong"
fi
if wanted a3c_numa; then
    step "a3c_numa: 16 A3C workers on the first NUMA node's cores only, against all cores (a3c_pong's row)"
    node0=$(lscpu -p=CPU,NODE | grep -v '^#' | awk -F, '$2 == 0 {print $1}' | paste -sd,)
    echo "node 0 cpus: $node0"
    timeout 240 taskset -c "$node0" python3 benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 1.67 \
        --workers 16 --eval-every 1000000 --eval-episodes 1 --out "$OUT/a3c_numa"
fi
if wanted a3c_perf; then
    step "a3c_perf: hardware counters of the whole machine (perf stat, 15 s) while A3C runs on Pong at 8, then 16 workers"
    if command -v perf > /dev/null; then
        for n in 8 16; do
            timeout 100 python3 benchmarks/atari_scale.py a3c --env ALE/Pong-v5 --minutes 1.2 --workers "$n" \
                --eval-every 100000000 --eval-episodes 1 --out "$OUT/a3c_perf_$n" > "$OUT/a3c_perf_$n.log" 2>&1 &
            sleep 40  # the workers started and stepping
            echo "--- $n workers"
            timeout 30 perf stat -a -e cycles,instructions,cache-references,cache-misses,LLC-load-misses,context-switches \
                -- sleep 15 2>&1 | grep -v "^$"
            wait
            tail -4 "$OUT/a3c_perf_$n/summary.md" 2>/dev/null
        done
    else
        echo "no perf on this machine"
    fi
fi
if wanted apex_pong; then
    step "apex_pong: Ape-X DQN on Pong, 14 actors, the unpaced learner on the GPU, 4 minutes"
    timeout 330 python3 benchmarks/atari_scale.py apex --env ALE/Pong-v5 --minutes 4 --actors 14 --device cuda \
        --eval-every 250000 --eval-episodes 3 --out "$OUT/apex_pong"
fi
if wanted gala_pong; then
    step "gala_pong: GALA with 4 and 8 learners (2 minutes each), then A2C at equal frames (at most 4), on Pong"
    timeout 600 python3 benchmarks/atari_scale.py gala --env ALE/Pong-v5 --minutes 2 --learners 4,8 \
        --eval-every 250000 --eval-episodes 3 --out "$OUT/gala_pong"
fi
step "done"
