"""Networks of the user's own (`--net`, `rlfleet.nets.user`) under every algorithm, on the parallel architectures,
and through checkpoints, `eval` and `--resume`; the factories are in tests/user_nets.py."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
import user_nets

from rlfleet import train
from rlfleet.algos import algorithm_names, resolve
from rlfleet.arch.shared import LocalCopy, algo_modules
from rlfleet.launch import check_run
from rlfleet.nets.models import ActorCritic, torch_default_init
from rlfleet.nets.user import NetError, UserNet, net_path
from rlfleet.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rlfleet.run.config import ConfigError
from rlfleet.run.evaluate import evaluate_checkpoint

CONTINUOUS = {"ddpg", "td3", "sac"}


@pytest.mark.parametrize("algo", algorithm_names())
def test_every_algorithm_puts_its_heads_on_the_user_network(algo):
    """Each network the algorithm builds from observations (actor, critics, Q, their targets) starts with a copy of
    the user's network; with `Scaled` (features × 2, which the NumPy fast path would miss) acting goes through torch
    and equals the model's own forward."""
    algo_cls, config_cls, _, _ = resolve(algo)
    env = gym.make("Pendulum-v1" if algo in CONTINUOUS else "CartPole-v1")
    agent = algo_cls(
        config_cls(net="user_nets:Scaled", net_kwargs={"width": 8}), env.observation_space, env.action_space
    )
    nets = [m for m in vars(agent).values() if isinstance(m, torch.nn.Module)]
    users = [u for net in nets for u in net.modules() if isinstance(u, UserNet)]
    assert users and all(isinstance(u.net, user_nets.Scaled) and u.out_dim == 8 for u in users)
    trained = {id(p) for u in users for p in u.parameters()}
    optimized = {id(p) for name, v in vars(agent).items() if "opt" in name for g in v.param_groups for p in g["params"]}
    assert trained & optimized, "the user network's parameters are trained"


def test_the_user_network_acts_through_torch_and_keeps_its_initialisation():
    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    torch.manual_seed(0)
    model = ActorCritic(space, 2, net="user_nets:mlp", net_kwargs={"width": 16}, ortho_init=False)
    before = [p.clone() for p in model.actor_body.parameters()]
    torch_default_init(model)  # what ortho_init=False does: never to the user's layers
    assert all(torch.equal(a, b) for a, b in zip(before, model.actor_body.parameters(), strict=True))
    assert model.numpy_forward(np.zeros((3, 4), np.float32)) is None  # a plain Sequential, yet never compiled


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_user_network_acts_in_eval_mode_and_learns_in_training_mode(algo):
    """Dropout and BatchNorm, as PyTorch users expect: acting (collection, evaluation) is deterministic for a greedy
    policy and leaves BatchNorm's running statistics alone, building the network (its probe) too; an update runs the
    network in training mode, and it stays there."""
    algo_cls, config_cls, _, _ = resolve(algo)
    env = gym.make("CartPole-v1")
    agent = algo_cls(config_cls(net="user_nets:Dropped"), env.observation_space, env.action_space)
    users = [u for m in vars(agent).values() if isinstance(m, torch.nn.Module) for u in m.modules()]
    users = [u for u in users if isinstance(u, UserNet)]
    norms = [m for u in users for m in u.net.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert norms and all(int(m.num_batches_tracked) == 0 for m in norms), "the probe moved BatchNorm's statistics"
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    first, again = agent.act(obs, explore=False)[0], agent.act(obs, explore=False)[0]
    np.testing.assert_array_equal(first, again)
    assert all(int(m.num_batches_tracked) == 0 for m in norms), "acting moved BatchNorm's statistics"
    assert all(u.net.training for u in users)  # what an update finds
    features = users[0](torch.as_tensor(obs))
    assert not torch.equal(features, users[0](torch.as_tensor(obs)))  # dropout draws: training mode outside acting


def test_a_part_the_factory_put_in_eval_mode_stays_there_through_acting_and_learning():
    """A pretrained backbone's BatchNorm held fixed (eval mode) while the rest fine-tunes: building the network and
    acting switched the whole module back to training mode, and every update then moved the pretrained statistics."""
    algo_cls, config_cls, _, _ = resolve("ppo")
    env = gym.make("CartPole-v1")
    agent = algo_cls(config_cls(net="user_nets:PretrainedNorm"), env.observation_space, env.action_space)
    user = next(u for u in agent.model.modules() if isinstance(u, UserNet))
    norm = user.net.backbone[1]
    agent.act(np.zeros((4, 4), np.float32), explore=True)
    assert not norm.training and user.net.head.training
    before = norm.running_mean.clone()
    user(torch.randn(8, 4))  # a learning pass
    assert torch.equal(norm.running_mean, before) and int(norm.num_batches_tracked) == 0


def test_net_given_as_an_object_is_kept_as_its_import_path():
    assert net_path(user_nets.mlp) == "user_nets:mlp" and net_path(user_nets.SmallCNN) == "user_nets:SmallCNN"
    with pytest.raises(NetError, match=r"^net= a Scaled object: give the factory that builds it \(the class, user_"):
        net_path(user_nets.Scaled(gym.spaces.Box(-1, 1, (4,))))
    with pytest.raises(NetError, match="a lambda or a local function, which other processes"):
        net_path(lambda space: torch.nn.Linear(4, 4))

    def local(space):
        return torch.nn.Linear(4, 4)

    with pytest.raises(NetError, match="a lambda or a local function"):
        net_path(local)
    local.__module__, local.__qualname__ = "__main__", "local"
    with pytest.raises(NetError, match="a class or function of the running script"):
        net_path(local)


def test_a_network_named_twice_alike_is_one_setting_and_an_encoder_beside_one_whole_module_is_kept():
    """`--net` and `--set net=` (and their kwargs) that agree are one setting; what is refused is their disagreeing
    and `net` beside both a whole actor and whole critics, not `net` beside one of them (it is the other's encoder)."""
    resolved, _ = check_run("ppo", "CartPole-v1", net=user_nets.mlp, net_kwargs={"width": 8},
                            overrides={"net": "user_nets:mlp", "net_kwargs": "{'width': 8}"})  # fmt: skip
    assert resolved.algo_cfg.net == "user_nets:mlp" and resolved.algo_cfg.net_kwargs == {"width": 8}
    resolved, agent = check_run("td3", "Pendulum-v1", net="user_nets:mlp", actor_net="user_nets:Actor")
    assert resolved.algo_cfg.actor_net == "user_nets:Actor" and len(agent.critic.encoders) == agent.critic.n


def test_a_user_network_goes_through_checkpoint_eval_and_resume(run_opts, tmp_path):
    first = train("ppo", "CartPole-v1", net=user_nets.mlp, net_kwargs={"width": 32}, steps=2_048, eval_every=2_048,
                  eval_episodes=1, name="r", seed=1, **run_opts)  # fmt: skip
    config = json.loads((first.run_dir / "config.json").read_text())
    assert config["algo"]["net"] == "user_nets:mlp" and config["algo"]["net_kwargs"] == {"width": 32}
    evaluated = evaluate_checkpoint(first.run_dir, episodes=2)
    assert len(evaluated["returns"]) == 2
    resumed = train(resume=first.run_dir, steps=4_096, progress=False)
    assert resumed["env_steps"] >= 4_096
    payload = load_checkpoint(first.run_dir / "checkpoints" / "latest.pt")
    assert payload["algo"]["model"]["actor_body.net.1.weight"].shape == (32, 4)  # the user's layers are saved


def test_a_checkpoint_whose_user_network_is_gone_or_changed_is_one_line(run_opts, tmp_path):
    run = train("dqn", "CartPole-v1", net="user_nets:mlp", net_kwargs={"width": 16}, steps=600, eval_every=600,
                eval_episodes=1, name="r", **run_opts)  # fmt: skip
    latest = run.run_dir / "checkpoints" / "latest.pt"
    payload = load_checkpoint(latest)
    save_checkpoint(latest, {**payload, "algo_config": {**payload["algo_config"], "net": "gone_pkg.nets:encoder"}})
    with pytest.raises(CheckpointError, match=r"'gone_pkg.nets:encoder' does not import: .*No module named 'gone_pkg'"):
        evaluate_checkpoint(latest, episodes=1)
    save_checkpoint(latest, {**payload, "algo_config": {**payload["algo_config"], "net_kwargs": {"width": 8}}})
    mismatch = (
        r"^checkpoint .* does not fit rlfleet's dqn \(RuntimeError: size mismatch for body\.net\.1\.weight: "
        r"copying a param with shape torch\.Size\(\[16, 4\]\)"
    )
    with pytest.raises(CheckpointError, match=mismatch):
        evaluate_checkpoint(latest, episodes=1)


@pytest.mark.parametrize(
    "algo, arch, options",
    [  # -m slow: data_parallel's, which also runs with Ray actors in tests/ray/test_ray_backend.py
        ("dqn", "apex", {"actors": 2, "learning_starts": 200}),
        ("a3c", "hogwild", {"workers": 2}),
        ("a2c", "grad_parallel", {"workers": 2}),
        ("a2c", "async_grad", {"workers": 2}),
        ("a2c", "param_server", {"workers": 2, "shards": 2}),
        ("ppo", "allreduce", {"workers": 2}),
        ("a2c", "gossip", {"learners": 2}),
        pytest.param("a2c", "data_parallel", {"workers": 2}, marks=pytest.mark.slow),
    ],
)
def test_the_parallel_architectures_build_the_user_network_in_their_worker_processes(algo, arch, options, run_opts):
    """The workers import the network by its path (they load the learner's weights, which only the user's network
    fits) and act with it: the run reaches its budget."""
    overrides = {"learning_starts": options.pop("learning_starts")} if "learning_starts" in options else {}
    result = train(algo, "CartPole-v1", arch=arch, net="user_nets:Scaled", steps=2_000, eval_every=2_000,
                   eval_episodes=1, overrides=overrides, **options, **run_opts)  # fmt: skip
    assert result["env_steps"] >= 2_000


def test_a_user_cnn_on_minatar_and_an_lstm_on_a_user_network(run_opts):
    pytest.importorskip("minatar")
    cnn = train("ppo", "MinAtar/Breakout-v1", net="user_nets:SmallCNN", steps=512, eval_every=512, eval_episodes=1,
                overrides={"n_envs": 4, "rollout_len": 64}, **run_opts)  # fmt: skip
    assert cnn["env_steps"] >= 512
    recurrent = train("a2c", "rlfleet/CartPoleNoVel-v1", net="user_nets:mlp", net_kwargs={"width": 16}, steps=1_000,
                      eval_every=1_000, eval_episodes=1, overrides={"lstm": 16}, **run_opts)  # fmt: skip
    assert recurrent["env_steps"] >= 1_000
    state = load_checkpoint(recurrent.run_dir)["algo"]["model"]
    assert state["actor_body.net.1.weight"].shape == (16, 2) and "core.cell.weight_ih" in state


@pytest.mark.parametrize("algo", sorted(CONTINUOUS))
def test_a_whole_actor_and_critics_of_the_user_take_the_built_in_ones_place(algo, run_opts):
    """ddpg, td3, sac: the user's actor (tanh or the squashing rlfleet's) and one user critic per member; the actor's
    loss reaches the actions through the critics, never the critics' weights; the run updates and checkpoints."""
    algo_cls, config_cls, _, _ = resolve(algo)
    env = gym.make("Pendulum-v1")
    user = {"actor_net": "user_nets:Actor", "actor_net_kwargs": {"gaussian": algo == "sac", "width": 32}}
    agent = algo_cls(config_cls(**user, critic_net="user_nets:Critic"), env.observation_space, env.action_space)
    assert isinstance(agent.actor.body.net, user_nets.Actor) and isinstance(agent.actor.head, torch.nn.Identity)
    members = agent.critic.members
    assert len(members) == agent.critic.n and all(isinstance(m.net, user_nets.Critic) for m in members)
    assert not list(agent.critic.weights)  # no built-in critic beside them
    obs, act = torch.zeros(5, 3), torch.zeros(5, 1, requires_grad=True)
    agent.critic(obs, act, detach=True).sum().backward()
    assert act.grad is not None and all(p.grad is None for p in agent.critic.parameters())
    result = train(algo, "Pendulum-v1", **user, critic_net="user_nets:Critic", steps=600, eval_every=600,
                   eval_episodes=1, overrides={"learning_starts": 200, "random_steps": 200}, **run_opts)  # fmt: skip
    state = load_checkpoint(result.run_dir)["algo"]
    assert {key.split(".")[1] for key in state["critic"]} == {str(k) for k in range(agent.critic.n)}  # members.K.net


def test_a_worker_s_copy_takes_the_learner_s_running_statistics_and_frozen_parameters():
    """Samplers and actors pulled only the trainable parameters: they acted with BatchNorm's initial statistics while
    the learner's moved, and with frozen layers drawn from their own seeds."""
    env = gym.make("CartPole-v1")
    algo_cls, config_cls, _, _ = resolve("ppo")
    for net in ("user_nets:Dropped", "user_nets:Frozen"):
        spaces = (env.observation_space, env.action_space)
        learner, worker = (algo_cls(config_cls(net=net), *spaces, seed=seed) for seed in (0, 1))
        with torch.no_grad():
            for m in learner.model.modules():
                if isinstance(m, torch.nn.BatchNorm1d):
                    m.running_mean.fill_(5.0)
                    m.num_batches_tracked.fill_(7)
        LocalCopy(worker, algo_modules(learner), share_frozen=False).pull()
        mine = worker.model.state_dict()
        for name, theirs in learner.model.state_dict().items():
            assert torch.equal(theirs, mine[name]), name


@pytest.mark.parametrize(
    "arch, net, options, message",
    [
        ("hogwild", "Dropped", {"workers": 2}, r"--arch hogwild would never learn the network's running statistics"),
        ("grad_parallel", "Dropped", {"workers": 2}, "running statistics"),
        ("param_server", "Dropped", {"workers": 2}, "running statistics"),
        ("gossip", "Dropped", {"learners": 2}, "running statistics"),
        ("param_server", "Frozen", {"workers": 2}, r"parameters \(model.actor_body.net.proj.weight\) would"),
        ("gossip", "Frozen", {"learners": 2, "distinct_init": True}, "frozen parameters"),
    ],
)
def test_an_architecture_that_would_lose_a_network_s_statistics_or_frozen_layers_refuses_it(arch, net, options, message,
                                                                                            tmp_path):  # fmt: skip
    """Their workers learn on copies and send back gradients or parameters: the checkpoint kept BatchNorm's initial
    statistics, and each role drew its own frozen layer."""
    with pytest.raises(ConfigError, match=message):
        train("a2c", "CartPole-v1", arch=arch, net=f"user_nets:{net}", steps=500, logdir=str(tmp_path), **options)
    assert not any(tmp_path.iterdir())
