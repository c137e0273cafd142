#!/usr/bin/env bash
# The project's checks that need a GPU machine, most valuable first, each bounded by its own timeout. Output: the
# terminal and $OUT/device_checks.log (with OUT unset: ./device-out). Packages the GPU machine lacks (gymnasium,
# ale-py, mujoco, stable-baselines3) come as wheels in .whl/ (docs/devices.md, "Measured", says how they are fetched).
#
#     bash benchmarks/device_checks.sh                 # every step, about 9 minutes
#     bash benchmarks/device_checks.sh tests sac       # some of them: tests updates learning sac
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
steps=${*:-tests updates learning sac}
wanted() { [[ " $steps " == *" $1 "* ]]; }
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi -L
nproc
python3 -c "import torch, gymnasium; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gymnasium', gymnasium.__version__)"

if wanted tests; then
    step "tests: the gpu test module, without its learning runs"
    timeout 150 python3 -m pytest tests/gpu -m "gpu and not learning" -p no:cacheprovider -q --durations=8
fi
if wanted updates; then
    step "updates: learner updates per second, CPU against GPU (the table behind --device auto)"
    timeout 100 python3 benchmarks/device_learner.py updates --repeats 3 --out "$OUT/device_updates.json"
fi
if wanted learning; then
    step "learning: the gpu test module's learning runs"
    timeout 120 python3 -m pytest tests/gpu -m "gpu and learning" -p no:cacheprovider -q --durations=8 -rA
fi
if wanted sac; then
    step "sac: SAC on HalfCheetah-v5, 20,000 steps, rlfleet and SB3 with the learner on the GPU"
    timeout 140 python3 benchmarks/device_learner.py sac --seeds 0 1 2 --out "$OUT/device_sac.json"
fi
step "done"
