"""Targets for processes the tests spawn. A spawned child imports its target by module name, and test modules
(imported by path) have no name a child could import; helpers in tests/ (on pytest's pythonpath) do."""

import torch

WORKER_TIMEOUT_S = 60


def step_with_constant_grad(optimizer, grad_value, wait_for, done):
    """Worker: after `wait_for` (if any), set every parameter's gradient to `grad_value`, step once, set `done`."""
    torch.set_num_threads(1)
    if wait_for is not None and not wait_for.wait(WORKER_TIMEOUT_S):
        raise TimeoutError("the first worker never finished its step")
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.full_like(param, grad_value)
    optimizer.step()
    done.set()
