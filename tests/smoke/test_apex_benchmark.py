"""`benchmarks/apex.py model` (the actor/learner cost model docs/architectures/apex.md quotes) runs the replay shard,
an actor and the learner as the architecture does, so that the script cannot fall behind their interfaces (it did
once: the shard's `sample` lost its β, and the learner's batch gained importance weights)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "apex.py"


def test_the_cost_model_runs_an_actor_and_the_learner(tmp_path):
    out = tmp_path / "model.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "model", "--seconds", "0.3", "--capacity", "2000", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    model = json.loads(out.read_text())
    assert model["learner_updates_per_s"] > 0 and model["actor_env_steps_per_s"] > 0
    assert model["updates_per_env_step"] == 0.25  # dqn's train_freq 4 over one env, one gradient step each
