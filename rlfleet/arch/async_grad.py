"""`async_grad`: asynchronous gradients — RLlib's AsyncGradientsOptimizer, A3C's update on a cluster's terms.

Each worker collects a segment with the weights it last received, computes the gradient of the algorithm's
loss on it and sends it; the learner applies every gradient as it arrives (one optimizer step each, clipped
to the algorithm's `max_grad_norm`) and the worker goes on with the weights that step produced. The other
workers' gradients may have been computed at older weights: `charts/policy_lag` (the learner's version at the
step minus the version a gradient was computed at) is that staleness: its mean over a run is at most
workers − 1 (one credit per worker), its maximum is not bounded (a fast worker may step several times during
a slow one's segment), as in RLlib, which sends the weights with each task, as here at each segment's start.
Unlike `hogwild`, whose lock-free
shared memory is one machine by nature, every update goes through the one learner, so the same loop runs on
any backend.

The learner steps with the algorithm's own optimizer by default (`--optimizer algo`: the class and
hyperparameters of the algorithm's single-process update, built afresh over the shared parameters: A2C's
RMSprop with its α and ε, PPO's Adam with its ε, ...), as RLlib's AsyncGradientsOptimizer applies each gradient
with the policy's own optimizer; with one worker a step is then the algorithm's own update on that worker's
segment. `--optimizer shared_rmsprop` (the A3C paper's, hogwild's default) and the other `rlfleet.optim.shared` kinds
can be chosen instead.

It is `grad_parallel`'s centre with one gradient set per step (`GradParallelRunner` with k = 1); its options
are the multi-process ones and the learner's `--optimizer`.
"""

from __future__ import annotations

from rlfleet.arch.grad_parallel import GradParallelRunner
from rlfleet.arch.parallel import AlgoOptimizerOptions


class AsyncGradRunner(GradParallelRunner):
    """The learner of an `async_grad` run: a step for each gradient, as it arrives."""

    arch = "async_grad"
    Options = AlgoOptimizerOptions

    def gradients_per_step(self) -> int:
        return 1
