"""`--device`: which device a learner gets, the errors for one it cannot have, and, on a machine without a GPU, every
algorithm on every architecture that takes a device run with its learner on PyTorch's `meta` device.

A meta tensor has a shape and no values, and PyTorch refuses to combine it with a CPU tensor just as it refuses a
CUDA one: an update that leaves a tensor on the CPU (a target made with `torch.from_numpy`, a state made with
`torch.zeros`) fails here as it would on a GPU. What a real GPU does with values the host reads back (metrics,
priorities, the acting copy) the `meta_learner` fixture stands in for: a value read from a meta tensor reads as
zeros. `.numpy()` straight on a device tensor is not stood in for: it fails on CUDA, so it fails here too.
"""

from __future__ import annotations

import importlib
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from device_cases import CASES, QUICK, case_id, run_case

from rlfleet import launch, train
from rlfleet.algos import resolve
from rlfleet.algos.updates import minibatch_epochs
from rlfleet.data.batch import Batch, obs_tensor, stack_obs
from rlfleet.data.demos import Demonstrations
from rlfleet.device import (
    HostCopy,
    acting,
    host_copy,
    host_modules,
    placement_note,
    resolve_device,
    sync_host,
    worker_device,
)
from rlfleet.fields import ConfigError
from rlfleet.optim.step import optimize

pytestmark = pytest.mark.usefixtures("meta_device")


def _demos(tmp_path, n: int = 64) -> str:
    rng = np.random.default_rng(0)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    data = Demonstrations(
        rng.normal(size=(n, 4)).astype(np.float32),
        rng.integers(2, size=n),
        np.ones(n, dtype=np.float32),
        starts,
        env="CartPole-v1",
        action_space=gym.spaces.Discrete(2),
    )
    path = tmp_path / "demos.npz"
    data.save(path)
    return str(path)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_algorithm_updates_with_its_learner_on_another_device(case, meta_learner, run_opts):
    result = run_case(train, case, "meta", run_opts)
    assert result["device"] == "meta"
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["device"] == "meta" and config["run"]["device"] == "meta"


@pytest.mark.atari
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_cnn_learner_updates_and_acts_on_its_device(algo, meta_learner, run_opts):
    pytest.importorskip("ale_py")
    small = {"ppo": {"rollout_len": 32, "minibatch_size": 32}, "dqn": {"learning_starts": 100, "buffer_size": 500}}
    result = train(
        algo, "ALE/Pong-v5", steps=300, n_envs=2, device="meta", overrides=small[algo],
        **QUICK, **run_opts,
    )  # fmt: skip
    assert result["updates"] > 0


def test_offline_learns_on_the_device(meta_learner, run_opts, tmp_path):
    result = train("bc", "CartPole-v1", dataset=_demos(tmp_path), steps=50, device="meta", **QUICK, **run_opts)
    assert result["device"] == "meta" and result["updates"] > 0


# ------------------------------------------------------------------------------------------ the acting copy
def _algo(name: str, env: str, device: str):
    algo_cls, config_cls, _, _ = resolve(name)
    e = gym.make(env)
    return algo_cls(config_cls(), e.observation_space, e.action_space, seed=0, device=device)


def test_an_mlp_acts_through_a_cpu_copy_refreshed_whenever_the_learner_changed(meta_learner):
    ppo = _algo("ppo", "CartPole-v1", "meta")
    assert all(p.is_meta for p in ppo.model.parameters())
    copy = acting(ppo.model)
    assert copy is not ppo.model and all(p.device.type == "cpu" for p in copy.parameters())
    assert acting(ppo.model) is copy  # one copy, reused
    refreshes = []
    real = HostCopy.refresh

    def counting(self, force=False):
        before = self.versions
        out = real(self, force)
        refreshes.append(self.versions != before)
        return out

    HostCopy.refresh = counting
    try:
        acting(ppo.model)
        assert refreshes == [False]  # unchanged since the last copy: nothing copied
        with torch.no_grad():
            next(ppo.model.parameters()).add_(1.0)  # any in-place write (an optimizer step, a load, an average)
        acting(ppo.model)
        assert refreshes[-1]
        ppo.model.load_state_dict(ppo.model.state_dict())
        acting(ppo.model)
        assert refreshes[-1]
    finally:
        HostCopy.refresh = real


def test_the_acting_copy_takes_the_learners_values():
    """On the CPU alone: a module whose copy is refreshed from another module with new values (what `HostCopy`
    does for a device module) gets them, buffers included."""
    source = torch.nn.BatchNorm1d(3)
    copy = HostCopy(source)
    with torch.no_grad():
        source.weight.fill_(2.0)
        source.running_mean.fill_(5.0)
    out = copy.refresh()
    assert torch.equal(out.weight, source.weight) and torch.equal(out.running_mean, source.running_mean)
    assert out.weight.data_ptr() != source.weight.data_ptr()


def test_workers_share_cpu_copies_of_a_learner_on_a_device(meta_learner):
    dqn = _algo("dqn", "CartPole-v1", "meta")
    modules = {"q": dqn.q, "q_target": dqn.q_target}
    shared = host_modules(modules)
    assert all(p.device.type == "cpu" for m in shared.values() for p in m.parameters())
    cpu = _algo("dqn", "CartPole-v1", "cpu")
    same = host_modules({"q": cpu.q})
    assert same["q"] is cpu.q  # a CPU learner's networks are shared as they are
    sync_host(modules.values())  # refreshes the copies; a CPU module has none to refresh
    sync_host([cpu.q])


def test_a_cnn_acts_on_the_learners_device(meta_learner):
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    algo_cls, config_cls, _, _ = resolve("ppo")
    ppo = algo_cls(config_cls(), space, gym.spaces.Discrete(6), device="meta")
    assert acting(ppo.model) is ppo.model
    actions, extras, _ = ppo.act(np.zeros((3, 4, 84, 84), np.uint8))
    assert actions.shape == (3,) and extras["value"].shape == (3,)


@pytest.mark.parametrize(
    "algo, overrides",
    [("sac", {}), ("sac", {"sde": True}), ("td3", {}), ("ddpg", {}), ("ppo", {"sde": True}), ("a2c", {})],
)
def test_a_users_cnn_for_box_actions_acts_on_the_learners_device(algo, overrides, meta_learner):
    """A CNN of the user's (`--net`) makes the actor act where it learns, exploring and greedy, gSDE's noise too."""
    frames, actions = gym.spaces.Box(0, 1, (4, 10, 10), np.uint8), gym.spaces.Box(-1, 1, (2,), np.float32)
    algo_cls, config_cls, _, _ = resolve(algo)
    learner = algo_cls(config_cls(net="user_nets:SmallCNN", **overrides), frames, actions, device="meta")
    learner.schedule(10**6, 10**6)  # past any warm-up of uniform actions
    actor = learner.actor if hasattr(learner, "actor") else learner.model
    assert acting(actor) is actor
    for explore in (True, False):
        taken, _, _ = learner.act(np.ones((3, 4, 10, 10), np.uint8), explore=explore)
        assert taken.shape == (3, 2) and np.all(np.abs(taken) <= 1)


@pytest.mark.parametrize(
    "space",
    [gym.spaces.MultiDiscrete([3, 4]), gym.spaces.Discrete(5, start=2),
     gym.spaces.Dict({"cell": gym.spaces.MultiDiscrete([2, 2]), "x": gym.spaces.Box(-1, 1, (3,))})],
    ids=["multidiscrete", "discrete", "dict"],
)  # fmt: skip
def test_one_hot_inputs_are_made_on_the_learners_device(space, meta_learner):
    """Discrete and MultiDiscrete observations become one-hots on the device the network is on."""
    algo_cls, config_cls, _, _ = resolve("ppo")
    ppo = algo_cls(config_cls(), space, gym.spaces.Discrete(2), device="meta")
    obs = obs_tensor(stack_obs([space.sample() for _ in range(4)]), "meta")
    dist, value = ppo.model(obs)
    assert dist.logits.device.type == value.device.type == "meta" and dist.logits.shape == (4, 2)


# ------------------------------------------------------------------------------------------ which device
def test_auto_gives_the_gpu_to_cnn_learners_only(monkeypatch):
    current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    # with its index, as `--device cuda` gives it, and made the current device (the one pinned memory is for)
    assert resolve_device("auto", convolutional=True, arch="single") == torch.device("cuda", 1) == current[-1]
    assert resolve_device("cuda", convolutional=True, arch="single") == torch.device("cuda", 1)
    assert resolve_device("cuda:0", convolutional=False, arch="single") == torch.device("cuda", 0) == current[-1]
    assert resolve_device("auto", convolutional=False, arch="single") == torch.device("cpu")
    assert resolve_device("auto", convolutional=True, arch="hogwild") == torch.device("cpu")
    assert resolve_device("auto", convolutional=True, arch="param_server") == torch.device("cpu")  # servers: no gain
    assert resolve_device("auto", convolutional=True, arch="gossip") == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", convolutional=True, arch="single") == torch.device("cpu")


def test_a_device_the_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="--device cuda: this machine has no CUDA device"):
        resolve_device("cuda", convolutional=False, arch="single")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    with pytest.raises(ConfigError, match=r"--device cuda:7: this machine has 1 CUDA device \(cuda:0\)"):
        resolve_device("cuda:7", convolutional=False, arch="single")
    with pytest.raises(ConfigError, match="the hogwild architecture learns on the CPU.*single, offline.*param_server"):
        resolve_device("cuda:0", convolutional=False, arch="hogwild")
    assert resolve_device("cuda:0", convolutional=False, arch="param_server") == torch.device("cuda", 0)


class DataWriteSGD(torch.optim.SGD):
    """Writes the parameters through `.data`, which, like a fused kernel, leaves their version counters alone."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-group["lr"])


def test_a_step_whose_kernel_leaves_the_version_counters_alone_still_refreshes_the_acting_copy(meta_learner):
    ppo = _algo("ppo", "CartPole-v1", "meta")
    opt = DataWriteSGD(ppo.model.parameters(), lr=0.1)
    copy = host_copy(ppo.model)
    acting(ppo.model)
    seen = copy.versions
    loss = sum(p.sum() for p in ppo.model.parameters())
    loss.backward()
    opt.step()
    assert tuple(src._version for _, src in copy.pairs) == seen  # what a fused step does: nothing to see
    loss = sum(p.sum() for p in ppo.model.parameters())
    optimize(opt, loss, list(ppo.model.parameters()), None)  # every algorithm steps through optimize
    acting(ppo.model)
    assert copy.versions != seen
    value = ppo.model.value_head.linear.weight
    before = value._version
    loss = sum(p.sum() for p in ppo.model.actor_body.parameters())  # a step of the policy's body alone
    optimize(opt, loss, list(ppo.model.parameters()), None)
    assert value._version == before  # a parameter the step did not write keeps its version (graphs on it hold)


@pytest.mark.parametrize(("name", "env"), [("dqn", "CartPole-v1"), ("td3", "Pendulum-v1"), ("ddpg", "Pendulum-v1")])
def test_a_replay_update_on_a_device_reads_its_priorities_only_for_a_prioritized_replay(name, env, meta_learner):
    """An update's |TD errors| stay on the device (a read would wait for the forward pass before the backward could
    be queued): a uniform replay never reads them, a prioritized one once, after the update."""
    algo_cls, config_cls, _, _ = resolve(name)
    e = gym.make(env)
    for prioritized, reads in ((False, 0), (True, 1)):
        algo = algo_cls(config_cls(prioritized=prioritized), e.observation_space, e.action_space, device="meta")
        buffer = algo.make_buffer(1, 1_000)
        for _ in range(64):
            obs, act, next_obs = e.observation_space.sample(), e.action_space.sample(), e.observation_space.sample()
            buffer.add(
                obs[None], np.asarray(act)[None], np.ones(1), next_obs[None], np.zeros(1, bool), np.zeros(1, bool)
            )
        batch = buffer.sample(32)
        before = meta_learner[0]
        priorities = algo.update(batch).pop("priorities")
        assert isinstance(priorities, torch.Tensor) and priorities.is_meta and priorities.shape == (32,)
        if prioritized:
            buffer.update_priorities(batch.index, priorities)
        assert meta_learner[0] - before == reads


def test_a_target_clock_the_host_reads_every_segment_stays_on_the_host(meta_learner):
    learner = _algo("nstep_q", "CartPole-v1", "meta")
    assert all(p.is_meta for p in learner.q.parameters()) and learner.target_clock.synced_at.device.type == "cpu"
    before = meta_learner[0]
    assert learner.target_clock.due(10_000) and not learner.target_clock.due(10_001)
    assert meta_learner[0] == before


def test_minibatch_steps_on_a_device_read_their_metrics_once_at_the_end(meta_learner):
    """Each read of a value on a device waits for every kernel queued before it: PPO's 16 minibatch steps (4 epochs
    of 4) keep their losses, entropy, clip fraction, KL and gradient norm on the device and read each mean once,
    at the end. On the CPU, where a read costs nothing, the loss's metrics are floats."""
    algo_cls, config_cls, _, _ = resolve("ppo")
    obs_space, act_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    rng = np.random.default_rng(0)
    batch = Batch(
        obs=rng.standard_normal((64, 4)).astype(np.float32),
        act=rng.integers(2, size=64),
        logp=np.full(64, -0.69, np.float32),
        value=np.zeros(64, np.float32),
        adv=rng.standard_normal(64).astype(np.float32),
        ret=rng.standard_normal(64).astype(np.float32),
    )
    cpu = algo_cls(config_cls(), obs_space, act_space, seed=0)
    assert all(isinstance(v, float) for v in cpu.loss(batch)[1].values())
    learner = algo_cls(config_cls(), obs_space, act_space, seed=0, device="meta")
    _, metrics = learner.loss(batch)
    assert all(isinstance(v, torch.Tensor) and v.is_meta for v in metrics.values()), metrics
    before = meta_learner[0]
    out = minibatch_epochs(learner, batch, epochs=4, minibatch_size=16, rng=rng)
    assert meta_learner[0] - before == len(metrics) + 1  # the means of the loss's metrics and the gradient norm
    assert set(out) == {*metrics, "grad_norm", "epochs"}


@pytest.mark.parametrize(
    ("algo", "arch", "learner", "options"),
    [
        ("ppo", "allreduce", "AllReduceLearner", {"workers": 1}),
        ("a2c", "gossip", "GossipLearner", {"learners": 2}),
        ("a2c", "grad_parallel", "GradientWorker", {"workers": 2}),
    ],
)
def test_learners_in_worker_roles_learn_on_the_run_device(
    algo, arch, learner, options, meta_learner, run_opts, monkeypatch
):
    """Each allreduce or gossip learner puts its own algorithm object on the run's device (here in the test's
    process, with the serial backend), not only the coordinator, which keeps their state; so does each gradient
    worker whose Ray role reserved a GPU (as if it had: `role_device`). What it sends the coordinator is host
    values: metrics as floats, a gradient as a NumPy array."""
    module = importlib.import_module(f"rlfleet.arch.{arch}")
    if arch == "grad_parallel":
        monkeypatch.setattr(module.GradParallelRunner, "role_device", lambda self: str(self.device))
    seen: list[set[str]] = []
    cls = getattr(module, learner)
    produce = cls.produce

    sent: list[type] = []
    grads: list[object] = []

    def spying(self, *args, **kwargs):
        seen.append({p.device.type for p in self.algo.params})
        item = produce(self, *args, **kwargs)
        sent.extend(type(v) for v in getattr(item, "metrics", {}).values())
        if getattr(item, "grad", None) is not None:
            grads.append(item.grad)
        return item

    monkeypatch.setattr(cls, "produce", spying)
    result = train(algo, "CartPole-v1", arch=arch, backend="serial", steps=300, device="meta", **options, **QUICK,
                   **run_opts)  # fmt: skip
    assert result["updates"] > 0 and seen and all(kinds == {"meta"} for kinds in seen)
    assert sent and set(sent) == {float}  # read on the host: a GPU's tensors would cross as CUDA handles
    assert all(isinstance(g, np.ndarray) for g in grads)


def test_a_worker_process_takes_the_device_it_sees():
    assert worker_device("cpu") == torch.device("cpu") and worker_device("meta") == torch.device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="sees no CUDA device .*--gpus-per-role"):
            worker_device("cuda:0")


def test_parameter_servers_keep_their_shards_on_the_run_device(meta_learner, run_opts, monkeypatch):
    """param_server's servers (here in the test's process, with the serial backend) hold their shards and optimizer
    state on the run's device; the coordinator, which learns nothing, and the workers stay on the CPU."""
    from rlfleet.arch import param_server

    seen: list[str] = []
    push = param_server.ParamShard.push

    def spying(self, *args, **kwargs):
        out = push(self, *args, **kwargs)
        seen.append(self.param.device.type)
        seen.extend(t.device.type for s in self.optimizer.state.values() for t in s.values() if t.dim() > 0)
        return out

    monkeypatch.setattr(param_server.ParamShard, "push", spying)
    result = train("a2c", "CartPole-v1", arch="param_server", workers=2, shards=2, backend="serial", steps=300,
                   device="meta", **QUICK, **run_opts)  # fmt: skip
    assert result["device"] == "meta" and result["updates"] > 0
    assert seen and set(seen) == {"meta"}
    assert all(p.device.type == "cpu" for p in result.algo.params)


def test_parameter_servers_on_ray_cannot_take_a_gpu(monkeypatch, run_opts):
    """Ray's services reserve no GPU, so servers there could not see one: one line, before anything starts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    with pytest.raises(ConfigError, match="--device cuda with --backend ray: the parameter servers are Ray actors"):
        train("a2c", "CartPole-v1", arch="param_server", backend="ray", device="cuda", steps=100, **run_opts)


def _checked(arch: str, resuming: bool = False, **options):
    """The run `train("a2c", "CartPole-v1", arch=arch, **options)` would make (or its resume, with `resuming`),
    checked and not started."""
    cfg = launch._run_config("a2c", "CartPole-v1", {"arch": arch, **options})
    cls = launch._runner(cfg)
    run = cls.__new__(cls)
    run._prepare(cfg, resuming=resuming)
    return run


@pytest.fixture
def gpus(monkeypatch):
    """This machine as one with `n` GPUs, as far as counting them goes (`gpus(n)`)."""
    return lambda n: monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize(
    ("arch", "options", "device"),
    [
        ("grad_parallel", {"backend": "ray", "gpus_per_role": 1.0}, "meta"),
        ("async_grad", {"backend": "ray", "gpus_per_role": 0.5}, "meta"),
        ("grad_parallel", {"backend": "ray"}, "cpu"),
        ("grad_parallel", {"backend": "local"}, "cpu"),
        ("allreduce", {"backend": "local"}, "meta"),
        ("data_parallel", {"backend": "local"}, "cpu"),
    ],
)
def test_roles_learn_on_the_device_where_the_architecture_and_their_reservation_say(arch, options, device, gpus):
    """Gradient workers compute on the run's device when their Ray role reserved a GPU, on the CPU otherwise;
    allreduce's learners always learn on it; samplers and actors act on the CPU."""
    gpus(2)
    assert _checked(arch, device="meta", **options).role_device() == device


def test_gpus_no_role_would_use_or_the_machine_lacks_are_refused_and_a_learner_without_one_too(gpus):
    gpus(1)
    with pytest.raises(ConfigError, match=r"^--gpus-per-role 1 has no effect on --arch data_parallel: its roles work "):
        _checked("data_parallel", backend="ray", gpus_per_role=1.0, device="meta")
    _checked("data_parallel", resuming=True, backend="ray", gpus_per_role=1.0)  # as runs from before the check did
    with pytest.raises(ConfigError, match=r"^--gpus-per-role 1 has no effect with the learner on the CPU \(--device "):
        _checked("grad_parallel", backend="ray", gpus_per_role=1.0, device="cpu")
    with pytest.raises(ConfigError, match=r"the CPU \(--device cpu\): .* or add --gpus-per-role 0 to the resume$"):
        _checked("grad_parallel", resuming=True, backend="ray", gpus_per_role=1.0, device="cpu")
    with pytest.raises(
        ConfigError, match=r"asks for 2 GPUs for 2 roles, and this machine has 1: .*--gpus-per-role 0.5 "
    ):
        _checked("grad_parallel", backend="ray", gpus_per_role=1.0, device="meta", workers=2)
    _checked("grad_parallel", backend="ray", gpus_per_role=0.5, device="meta", workers=2)
    gpus(0)
    with pytest.raises(ConfigError, match=r"^--gpus-per-role 0.5: this machine has no GPU for the roles to reserve$"):
        _checked("grad_parallel", backend="ray", gpus_per_role=0.5, device="meta", workers=2)
    with pytest.raises(ConfigError, match=r"^hogwild updates parameters in shared memory"):  # its own problem first
        _checked("hogwild", backend="ray", gpus_per_role=1.0)
    run = _checked("allreduce", backend="ray", device="meta", workers=2)
    run.device = torch.device("cuda", 0)  # what --device cuda resolves to on a machine with one
    with pytest.raises(ConfigError, match=r"each allreduce learner is a Ray actor that sees only the GPUs it reserves"):
        run.check_role_gpus()
    gpus(2)
    run.opts.gpus_per_role = 1.0
    run.check_role_gpus()


def test_the_first_line_says_where_learners_act(monkeypatch):
    """A CNN learner acts on its device, an MLP one through a CPU copy; gradient workers on reserved GPUs say so."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    algo_cls, config_cls, _, _ = resolve("ppo")
    cnn = algo_cls(config_cls(), gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), device="meta")
    mlp = _algo("ppo", "CartPole-v1", "cpu")
    gpu = torch.device("cuda", 0)
    assert "each acts on it too (a CNN policy)" in placement_note(gpu, cnn, workers_act=True, arch="gossip")
    assert "each acts on the CPU with a copy" in placement_note(gpu, mlp, workers_act=True, arch="allreduce")
    assert "acting on it too (a CNN policy)" in placement_note(gpu, cnn, workers_act=False)
    note = placement_note(gpu, mlp, workers_act=True, arch="grad_parallel", workers_learn=True)
    assert "each gradient worker computes on the GPU its Ray role reserved" in note
    assert "the workers act on the CPU" in placement_note(gpu, cnn, workers_act=True, arch="data_parallel")
