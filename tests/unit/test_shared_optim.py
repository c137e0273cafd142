"""Hogwild optimisers: Shared RMSProp and momentum SGD against the paper's formulas, state shared across spawned
processes, SharedAdam against torch.optim.Adam, state_dict round trips that keep the shared storage,
`build_optimizer`."""

import copy
import io
import math
import pickle

import pytest
import torch
import torch.multiprocessing as mp
from spawned import WORKER_TIMEOUT_S, step_with_constant_grad
from torch import nn

from rlfleet.optim.make import make_optimizer
from rlfleet.optim.shared import (
    HOGWILD_OPTIMIZERS,
    MomentumSGD,
    OptimizerRecipe,
    SharedAdam,
    SharedRMSprop,
    build_optimizer,
    is_shared,
)


def run_two_workers(optimizer, grads):
    """Two spawned workers step the same optimizer once each, the second only after the first has finished."""
    ctx = mp.get_context("spawn")
    first_done, second_done = ctx.Event(), ctx.Event()
    workers = [
        ctx.Process(target=step_with_constant_grad, args=(optimizer, grads[0], None, first_done)),
        ctx.Process(target=step_with_constant_grad, args=(optimizer, grads[1], first_done, second_done)),
    ]
    for worker in workers:
        worker.start()  # both start at once (import time overlaps); the Event orders their steps
    workers[0].join(WORKER_TIMEOUT_S)
    if workers[0].exitcode == 0:
        workers[1].join(WORKER_TIMEOUT_S)
    for worker in workers:  # a failed or hung first worker must not leave the second waiting for its Event
        if worker.is_alive():
            worker.kill()
            worker.join()
    assert [w.exitcode for w in workers] == [0, 0], "a worker failed; its traceback is in the captured stderr"
    assert first_done.is_set() and second_done.is_set()


def shared_linear(seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    model.share_memory()
    return model


def state_tensors(optimizer):
    return [t for state in optimizer.state.values() for t in state.values()]


# --- SharedRMSprop -----------------------------------------------------------------------------------------------


def test_shared_rmsprop_matches_paper_formula_by_hand():
    lr, alpha, eps = 0.01, 0.9, 0.1
    theta0 = [[1.0, -2.0, 0.5], [3.0]]
    grads = [[[0.3, -0.6, 1.2], [2.0]], [[0.1, 0.2, -0.4], [-1.0]]]
    params = [nn.Parameter(torch.tensor(values, dtype=torch.float64)) for values in theta0]
    opt = SharedRMSprop(params, lr=lr, alpha=alpha, eps=eps)

    # by hand, elementwise, in Python floats: g ← αg + (1−α)Δθ², θ ← θ − ηΔθ/√(g+ε)
    theta = copy.deepcopy(theta0)
    g = [[0.0] * len(values) for values in theta0]
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = torch.tensor(grad, dtype=torch.float64)
        opt.step()
        for i, grad in enumerate(step_grads):
            for j, d in enumerate(grad):
                g[i][j] = alpha * g[i][j] + (1 - alpha) * d * d
                theta[i][j] = theta[i][j] - lr * d / math.sqrt(g[i][j] + eps)
        for i, param in enumerate(params):
            assert param.tolist() == pytest.approx(theta[i], rel=1e-12, abs=1e-12)
            assert opt.state[param]["square_avg"].tolist() == pytest.approx(g[i], rel=1e-12, abs=1e-12)
    # a literal spot check of the first element: g = 0.9·0.009 + 0.1·0.01, two steps of size η·Δθ/√(g+ε)
    expected = 1.0 - 0.01 * 0.3 / math.sqrt(0.009 + 0.1) - 0.01 * 0.1 / math.sqrt(0.0091 + 0.1)
    assert params[0][0].item() == pytest.approx(expected, rel=1e-12)
    assert opt.state[params[0]]["step"].item() == 2


def test_shared_rmsprop_weight_decay_is_added_to_the_gradient_first():
    lr, alpha, eps, wd = 0.1, 0.5, 0.01, 0.2
    param = nn.Parameter(torch.tensor([2.0, -1.0], dtype=torch.float64))
    opt = SharedRMSprop([param], lr=lr, alpha=alpha, eps=eps, weight_decay=wd)
    param.grad = torch.tensor([0.5, 0.0], dtype=torch.float64)
    opt.step()
    # Δθ = grad + wd·θ = [0.9, -0.2]; g = (1−α)Δθ² = [0.405, 0.02]; θ ← θ − ηΔθ/√(g+ε)
    expected = [2.0 - lr * 0.9 / math.sqrt(0.405 + eps), -1.0 + lr * 0.2 / math.sqrt(0.02 + eps)]
    assert param.tolist() == pytest.approx(expected, rel=1e-12)
    assert opt.state[param]["square_avg"].tolist() == pytest.approx([0.405, 0.02], rel=1e-12)


@pytest.mark.parametrize("optimizer_cls", [SharedRMSprop, SharedAdam, MomentumSGD])
def test_shared_optimizers_return_the_closure_loss_and_skip_params_without_grad(optimizer_cls):
    model = shared_linear()
    frozen = nn.Parameter(torch.ones(2))
    opt = optimizer_cls([*model.parameters(), frozen], lr=0.01)
    before = [p.detach().clone() for p in (*model.parameters(), frozen)]

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(1, 3)).pow(2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() > 0
    assert all(not torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=False))
    assert torch.equal(frozen, before[-1]) and opt.state[frozen]["step"].item() == 0


@pytest.mark.parametrize("optimizer_cls", [SharedRMSprop, SharedAdam, MomentumSGD])
def test_shared_optimizers_refuse_sparse_gradients(optimizer_cls):
    param = nn.Parameter(torch.zeros(3))
    opt = optimizer_cls([param], lr=0.01)
    param.grad = torch.sparse_coo_tensor([[1]], [1.0], (3,), check_invariants=True)
    with pytest.raises(RuntimeError, match=f"{optimizer_cls.__name__} does not support sparse gradients"):
        opt.step()
    assert torch.equal(param, torch.zeros(3))


def test_shared_rmsprop_defaults_and_eager_shared_state():
    model = shared_linear()
    opt = SharedRMSprop(model.parameters())
    assert opt.defaults == {"lr": 7e-4, "alpha": 0.99, "eps": 1e-10, "weight_decay": 0.0}
    assert len(opt.state) == 2  # created at construction, before any step
    assert all(t.is_shared() for t in state_tensors(opt))
    extra = nn.Parameter(torch.ones(4))
    opt.add_param_group({"params": [extra]})
    assert opt.state[extra]["square_avg"].is_shared()


def test_shared_rmsprop_statistics_are_shared_across_spawned_processes():
    lr, alpha, eps = 0.01, 0.99, 0.1
    c1, c2 = 0.5, -2.0
    model = shared_linear()
    theta0 = [p.detach().clone() for p in model.parameters()]
    opt = SharedRMSprop(model.parameters(), lr=lr, alpha=alpha, eps=eps)
    ptrs = [t.data_ptr() for t in state_tensors(opt)]

    run_two_workers(opt, (c1, c2))

    g1 = (1 - alpha) * c1**2
    g2 = alpha * g1 + (1 - alpha) * c2**2  # only right if worker 2 saw worker 1's g
    delta = -lr * c1 / math.sqrt(g1 + eps) - lr * c2 / math.sqrt(g2 + eps)
    for param, start in zip(model.parameters(), theta0, strict=True):
        torch.testing.assert_close(opt.state[param]["square_avg"], torch.full_like(param, g2))
        torch.testing.assert_close(opt.state[param]["step"], torch.tensor(2.0))
        torch.testing.assert_close(param.detach(), start + delta)
    assert [t.data_ptr() for t in state_tensors(opt)] == ptrs


def test_shared_rmsprop_state_dict_round_trip_keeps_shared_storage():
    model = shared_linear()
    opt = SharedRMSprop(model.parameters(), lr=0.01)
    for value in (1.0, -0.5):
        for param in model.parameters():
            param.grad = torch.full_like(param, value)
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    saved = copy.deepcopy(opt.state_dict())

    # resume into a fresh optimizer over another shared model: values load, storage stays the shared one
    resumed = SharedRMSprop(shared_linear(seed=1).parameters(), lr=0.5)
    ptrs = [t.data_ptr() for t in state_tensors(resumed)]
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer))
    assert [t.data_ptr() for t in state_tensors(resumed)] == ptrs
    assert all(t.is_shared() for t in state_tensors(resumed))
    assert resumed.param_groups[0]["lr"] == 0.01
    for a, b in zip(state_tensors(resumed), state_tensors(opt), strict=True):
        torch.testing.assert_close(a, b)

    # loading into the same optimizer after more steps restores the saved values in place
    ptrs = [t.data_ptr() for t in state_tensors(opt)]
    opt.step()
    opt.load_state_dict(saved)
    assert [t.data_ptr() for t in state_tensors(opt)] == ptrs
    for param, state in zip(model.parameters(), saved["state"].values(), strict=True):
        torch.testing.assert_close(opt.state[param]["square_avg"], state["square_avg"])
        assert opt.state[param]["step"].item() == 2


def test_load_state_dict_rejects_other_shapes():
    opt = SharedRMSprop(shared_linear().parameters())
    other = SharedRMSprop(nn.Linear(4, 2).parameters())
    with pytest.raises(ValueError, match="another model"):
        opt.load_state_dict(other.state_dict())


# --- MomentumSGD -------------------------------------------------------------------------------------------------


def test_momentum_sgd_matches_paper_recurrence_by_hand():
    """m ← αm + (1 − α)Δθ, θ ← θ − ηm (Supplementary 7), m starting at 0, over several steps."""
    lr, alpha = 0.1, 0.9
    theta0 = [[1.0, -2.0], [0.5]]
    grads = [[[1.0, 0.0], [-3.0]], [[-2.0, 4.0], [1.0]], [[0.5, 0.5], [0.0]], [[0.0, -1.0], [2.0]]]
    params = [nn.Parameter(torch.tensor(values, dtype=torch.float64)) for values in theta0]
    opt = MomentumSGD(params, lr=lr, momentum=alpha)

    theta = copy.deepcopy(theta0)
    m = [[0.0] * len(values) for values in theta0]
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = torch.tensor(grad, dtype=torch.float64)
        opt.step()
        for i, grad in enumerate(step_grads):
            for j, d in enumerate(grad):
                m[i][j] = alpha * m[i][j] + (1 - alpha) * d
                theta[i][j] = theta[i][j] - lr * m[i][j]
        for i, param in enumerate(params):
            assert param.tolist() == pytest.approx(theta[i], rel=1e-12, abs=1e-12)
            assert opt.state[param]["momentum_buffer"].tolist() == pytest.approx(m[i], rel=1e-12, abs=1e-12)
    # literal check of the first element: m = 0.1, −0.11, −0.049, −0.0441; θ = 1 − 0.1·Σm
    assert params[0][0].item() == pytest.approx(1.0 - 0.1 * (0.1 - 0.11 - 0.049 - 0.0441), rel=1e-12)
    assert opt.state[params[0]]["step"].item() == 4


def test_momentum_sgd_step_is_one_minus_alpha_of_torch_momentum_sgd():
    """Under a constant gradient torch's SGD(momentum=α) steps up to η/(1 − α)·Δθ, the paper's rule only ηΔθ."""
    ours, theirs = nn.Parameter(torch.zeros(1, dtype=torch.float64)), nn.Parameter(torch.zeros(1, dtype=torch.float64))
    paper, torch_sgd = MomentumSGD([ours], lr=0.1, momentum=0.9), torch.optim.SGD([theirs], lr=0.1, momentum=0.9)
    for _ in range(300):
        for param in (ours, theirs):
            param.grad = torch.ones(1, dtype=torch.float64)
        paper.step()
        torch_sgd.step()
    assert paper.state[ours]["momentum_buffer"].item() == pytest.approx(1.0, rel=1e-9)  # m → Δθ
    assert torch_sgd.state[theirs]["momentum_buffer"].item() == pytest.approx(10.0, rel=1e-9)  # Δθ/(1 − α)


def test_momentum_sgd_weight_decay_defaults_and_bad_values():
    param = nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    opt = MomentumSGD([param], lr=0.5, momentum=0.5, weight_decay=0.25)
    param.grad = torch.tensor([1.0], dtype=torch.float64)
    opt.step()  # Δθ = 1 + 0.25·2 = 1.5; m = 0.5·1.5 = 0.75; θ = 2 − 0.5·0.75
    assert param.item() == pytest.approx(1.625, rel=1e-12)
    assert MomentumSGD(shared_linear().parameters()).defaults == {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.0}
    for bad in ({"lr": -1.0}, {"momentum": 1.0}, {"momentum": -0.1}, {"weight_decay": -1.0}):
        with pytest.raises(ValueError, match=f"MomentumSGD: {next(iter(bad))} must be"):
            MomentumSGD([param], **bad)


# --- SharedAdam --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_shared_adam_matches_torch_adam(weight_decay):
    kwargs = {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": weight_decay}
    ours, reference = shared_linear(), shared_linear()
    opt, ref_opt = SharedAdam(ours.parameters(), **kwargs), torch.optim.Adam(reference.parameters(), **kwargs)
    torch.manual_seed(2)
    for _ in range(2):  # the first step from zero state, then one more (bias correction at step 2)
        grads = [torch.randn_like(p) for p in ours.parameters()]
        for model in (ours, reference):
            for param, grad in zip(model.parameters(), grads, strict=True):
                param.grad = grad.clone()
        opt.step()
        ref_opt.step()
        for param, ref in zip(ours.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(param, ref)
            for key in ("step", "exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt.state[param][key], ref_opt.state[ref][key])


def test_shared_adam_state_is_shared_across_spawned_processes():
    grads = (0.5, -2.0)
    model, reference = shared_linear(), shared_linear()
    opt, ref_opt = SharedAdam(model.parameters(), lr=0.01), SharedAdam(reference.parameters(), lr=0.01)
    assert all(t.is_shared() for t in state_tensors(opt))

    run_two_workers(opt, grads)

    for value in grads:  # the same two steps in this process
        for param in reference.parameters():
            param.grad = torch.full_like(param, value)
        ref_opt.step()
    for param, ref in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.detach(), ref.detach())
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[param][key], ref_opt.state[ref][key])
        assert opt.state[param]["step"].item() == 2


def test_shared_adam_state_dict_round_trip_keeps_shared_storage():
    model = shared_linear()
    opt = SharedAdam(model.parameters())
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    ptrs = [t.data_ptr() for t in state_tensors(opt)]
    for _ in range(3):
        opt.step()
    opt.load_state_dict(saved)
    assert [t.data_ptr() for t in state_tensors(opt)] == ptrs
    assert all(t.is_shared() for t in state_tensors(opt))
    for param, state in zip(model.parameters(), saved["state"].values(), strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[param][key], state[key])
    assert opt.state[next(model.parameters())]["step"].item() == 1


def test_shared_adam_loads_a_torch_adam_checkpoint():
    model = shared_linear()
    ref_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    ref_opt.step()
    opt = SharedAdam(model.parameters())
    ptrs = [t.data_ptr() for t in state_tensors(opt)]
    opt.load_state_dict(ref_opt.state_dict())
    assert [t.data_ptr() for t in state_tensors(opt)] == ptrs
    for param in model.parameters():
        torch.testing.assert_close(opt.state[param]["exp_avg"], ref_opt.state[param]["exp_avg"])
        assert opt.state[param]["step"].item() == 1


# --- build_optimizer ---------------------------------------------------------------------------------------------


def test_build_optimizer_kinds_and_defaults():
    params = list(shared_linear().parameters())
    assert HOGWILD_OPTIMIZERS == ("shared_rmsprop", "rmsprop", "momentum_sgd", "shared_adam")
    assert [is_shared(name) for name in HOGWILD_OPTIMIZERS] == [True, False, False, True]

    shared_rms = build_optimizer("shared_rmsprop", params, lr=1e-3)
    assert type(shared_rms) is SharedRMSprop and shared_rms.defaults["lr"] == 1e-3
    assert type(build_optimizer("shared_adam", params, lr=1e-3, betas=(0.5, 0.9))) is SharedAdam

    rms = build_optimizer("rmsprop", params, lr=1e-3)
    assert type(rms) is SharedRMSprop and rms is not build_optimizer("rmsprop", params, lr=1e-3)
    assert (rms.defaults["alpha"], rms.defaults["eps"]) == (0.99, 1e-10)
    assert build_optimizer("rmsprop", params, lr=1e-3, eps=1e-3).defaults["eps"] == 1e-3

    sgd = build_optimizer("momentum_sgd", params, lr=1e-2)
    assert type(sgd) is MomentumSGD and sgd.defaults["momentum"] == 0.9
    assert build_optimizer("momentum_sgd", params, lr=1e-2, momentum=0.0).defaults["momentum"] == 0.0


@pytest.mark.parametrize("name", ["rmsprop", "momentum_sgd"])
def test_per_worker_kinds_keep_separate_statistics(name):
    params = list(shared_linear().parameters())
    first, second = build_optimizer(name, params, lr=1e-3), build_optimizer(name, params, lr=1e-3)
    key = "square_avg" if name == "rmsprop" else "momentum_buffer"
    for opt, value in ((first, 1.0), (second, 3.0)):
        for param in params:
            param.grad = torch.full_like(param, value)
        opt.step()
    for param in params:
        a, b = first.state[param][key], second.state[param][key]
        assert a.data_ptr() != b.data_ptr()
        expected_a, expected_b = (0.01, 0.09) if name == "rmsprop" else (0.1, 0.3)  # (1−α)c² or (1−α)c
        torch.testing.assert_close(a, torch.full_like(param, expected_a))
        torch.testing.assert_close(b, torch.full_like(param, expected_b))


def test_unknown_optimizer_name_lists_the_choices():
    params = list(shared_linear().parameters())
    with pytest.raises(
        ValueError,
        match="unknown optimizer 'adamw'; choose one of algo, shared_rmsprop, rmsprop, momentum_sgd, "
        r"shared_adam \(algo: the algorithm's own\)$",
    ):
        build_optimizer("adamw", params, lr=1e-3)
    with pytest.raises(ValueError, match="unknown optimizer"):
        is_shared("adam")


@pytest.mark.parametrize("name", ["adam", "rmsprop", "sgd"])
def test_algo_builds_a_fresh_copy_of_the_algorithms_own_optimizer(name):
    """`"algo"`: the class and hyperparameters of the algorithm's optimizer (`make_optimizer`'s, FusedAdam included),
    a new instance with its own state over the parameters given, at the learning rate given."""
    source, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    own = make_optimizer(name, source.parameters(), 3e-3, weight_decay=0.1)
    assert is_shared("algo") is False
    fresh = build_optimizer("algo", list(target.parameters()), 1e-3, algo_optimizer=own)
    assert type(fresh) is type(own) and fresh is not own
    assert fresh.param_groups[0]["params"] == list(target.parameters())
    assert fresh.defaults == {**own.defaults, "lr": 1e-3} and fresh.param_groups[0]["weight_decay"] == 0.1
    recipe = OptimizerRecipe.of(own)
    assert pickle.loads(pickle.dumps(recipe)) == recipe and recipe.elementwise
    # the same steps as the original, from the same start
    target.load_state_dict(source.state_dict())
    fresh = recipe.build(target.parameters(), 3e-3)
    for _ in range(3):
        for model, opt in ((source, own), (target, fresh)):
            opt.zero_grad()
            model(torch.ones(4, 3)).square().sum().backward()
            opt.step()
    for a, b in zip(source.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)


def test_algo_needs_the_algorithms_optimizer_and_one_parameter_group():
    params = list(shared_linear().parameters())
    with pytest.raises(ValueError, match="optimizer 'algo' copies the algorithm's own: pass it as algo_optimizer"):
        build_optimizer("algo", params, lr=1e-3)
    two_groups = torch.optim.Adam([{"params": params[:1]}, {"params": params[1:], "lr": 1.0}], lr=1e-3)
    with pytest.raises(ValueError, match="Adam has 2 parameter groups; optimizer 'algo' copies one group's"):
        OptimizerRecipe.of(two_groups)
    assert not OptimizerRecipe.of(torch.optim.LBFGS(params)).elementwise


def test_the_old_sgd_name_is_refused_with_a_pointer_to_momentum_sgd():
    """`sgd` was torch's SGD(momentum=0.9), a step 10x the paper's rule: refused, not silently rescaled."""
    params = list(shared_linear().parameters())
    for call in (lambda: build_optimizer("sgd", params, lr=1e-3), lambda: is_shared("sgd")):
        with pytest.raises(ValueError, match=r"optimizer 'sgd' is now 'momentum_sgd'.*10x the learning rate"):
            call()


@pytest.mark.parametrize(
    ("make_torch", "make_shared", "says"),
    [
        (lambda p: torch.optim.RMSprop(p, centered=True), SharedRMSprop, "saved with centered=True"),
        (lambda p: torch.optim.RMSprop(p, momentum=0.9), SharedRMSprop, "saved with momentum=0.9"),
        (lambda p: torch.optim.RMSprop(p), SharedRMSprop, "torch.optim.RMSprop's, whose eps is added outside"),
        (lambda p: torch.optim.Adam(p, amsgrad=True), SharedAdam, "saved with amsgrad=True"),
        (lambda p: torch.optim.Adam(p, maximize=True), SharedAdam, "saved with maximize=True"),
    ],
)
def test_a_torch_optimizer_state_with_options_the_shared_one_lacks_is_refused(make_torch, make_shared, says):
    """They loaded without a word and then stepped without the option (uncentred, no momentum, no AMSGrad), or with
    torch's ε read as one inside the root: a step floor √1e-8 = 1e-4, ten times the intended one."""
    model = shared_linear()
    ref_opt = make_torch(model.parameters())
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    ref_opt.step()
    opt = make_shared(model.parameters())
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=says):
        opt.load_state_dict(ref_opt.state_dict())
    assert opt.param_groups[0]["lr"] == before["param_groups"][0]["lr"] and "amsgrad" not in opt.param_groups[0]
