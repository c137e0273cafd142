"""Parameter servers with a bug where the coordinator pulls them: a spawned server process imports them by name."""

import os

from rlfleet.arch.param_server import ParamShard, ShardServers, ShardState


class ShardFailingState(ParamShard):
    """A server that answers its first `after` `state` calls (the coordinator's pulls), then raises."""

    def __init__(self, *args, after: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.after, self.pulls = after, 0

    def state(self) -> ShardState:
        self.pulls += 1
        if self.pulls > self.after:
            raise ValueError("state fails on purpose")
        return super().state()


class ServersFailingState(ShardServers):
    """`ShardServers` whose servers are `ShardFailingState`s (`FAIL_AFTER` pulls answered: set by the test)."""

    FAIL_AFTER = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.after = self.FAIL_AFTER  # an attribute, so that it travels to the server process

    def __call__(self, index: int, incarnation: int) -> ParamShard:
        state = self.states[index]
        return ShardFailingState(state, self.optimizer, self.lr, self.algo_optimizer, self.device, after=self.after)


class ShardExitingAtState(ParamShard):
    """A server whose process dies at its first `state` call (every incarnation's)."""

    def state(self) -> ShardState:
        os._exit(3)


class ServersExitingAtState(ShardServers):
    """`ShardServers` whose servers are `ShardExitingAtState`s."""

    def __call__(self, index: int, incarnation: int) -> ParamShard:
        return ShardExitingAtState(self.states[index], self.optimizer, self.lr, self.algo_optimizer, self.device)
