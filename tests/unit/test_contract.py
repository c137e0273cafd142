"""Every registered algorithm keeps the contract of the data it learns from (`rlfleet/algos/contract.py`): each
member of its protocol is there, and each method takes the protocol's parameters; the Ape-X actors are exactly
dqn, ddpg and td3; the algorithms with an `lstm` option are `Recurrent`."""

from __future__ import annotations

import inspect

import gymnasium as gym
import pytest

from rlfleet.algos import algorithm_names, resolve
from rlfleet.algos.contract import ApexActor, Recurrent, ReplayAlgorithm, contract_of

BOX = {"ddpg", "td3", "sac"}  # continuous actions only


def build(name: str):
    cls, config_cls, _, variant = resolve(name)
    env = gym.make("Pendulum-v1" if name in BOX else "CartPole-v1")
    return cls(config_cls(**variant), env.observation_space, env.action_space, seed=0)


def protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    """The methods a protocol (and the protocols it extends) declares, with their signatures."""
    methods = {}
    for klass in reversed(protocol.__mro__):
        for name, member in vars(klass).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                methods[name] = inspect.signature(member)
    return methods


@pytest.mark.parametrize("name", algorithm_names())
def test_every_algorithm_keeps_the_contract_of_its_data(name):
    algo = build(name)
    protocol = contract_of(algo)
    assert isinstance(algo, protocol), f"{name} lacks members of {protocol.__name__}"
    for method, signature in protocol_methods(protocol).items():
        given = [p for p in signature.parameters.values() if p.name != "self"]
        own = inspect.signature(getattr(algo, method))
        try:
            own.bind(*[None for p in given if p.default is inspect.Parameter.empty],
                     **{p.name: p.default for p in given if p.default is not inspect.Parameter.empty})  # fmt: skip
        except TypeError as exc:
            pytest.fail(f"{name}.{method}{own} does not take {protocol.__name__}.{method}{signature}: {exc}")


def test_the_apex_actors_are_dqn_ddpg_and_td3():
    actors = {name for name in algorithm_names() if isinstance(build(name), ApexActor)}
    assert actors == {"dqn", "ddpg", "td3"}
    assert {name for name in algorithm_names() if isinstance(build(name), ReplayAlgorithm)} == actors | {"sac"}


def test_the_algorithms_with_an_lstm_option_are_recurrent():
    with_lstm = {name for name in algorithm_names() if "lstm" in resolve(name)[1].__dataclass_fields__}
    assert with_lstm == {"a2c", "a3c", "ppo", "dqn"}
    assert all(isinstance(build(name), Recurrent) for name in with_lstm)
