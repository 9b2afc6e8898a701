"""Training: meshfuse.optim against torch.optim step by step (in place, state placed like the
parameter, bf16 with f32 masters), sharded training loops (DDP, Megatron TP) against one device
on 1, 2 and 4 ranks, the plan of a whole step, torch_interop.autograd inside a torch loop, and
the typed errors."""

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import DataType, Replicate, Shard

import helpers as H

R = Replicate()


def _layouts():
    """Placements of two parameters: sharded on dim 0 when the world size divides 8, else replicated."""
    return [[Shard(0)] if 8 % meshfuse.world_size() == 0 else [R], [R]]


def _address(d):
    local = d.to_local()
    return local.data_ptr() if isinstance(local, torch.Tensor) else local.__array_interface__["data"][0]


def _run_optimizer(make_ours, make_torch, steps=4, dtype=np.float32):
    rng = np.random.default_rng(0)
    mesh = H.world_mesh()
    full = [H.randn(rng, 8, 3), H.randn(rng, 5)]
    params = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip(full, _layouts())]
    ref = [torch.tensor(a, requires_grad=True) for a in full]
    # (distribute_tensor's blocks are read-only views: the optimizer gives them writable memory once.)
    ours, theirs = make_ours(params), make_torch(ref)
    addresses = [_address(p) for p in params]
    for step in range(steps):
        grads = [H.randn(rng, *a.shape) for a in full]
        ours.step([meshfuse.distribute_tensor(g, mesh, p) for g, p in zip(grads, _layouts())])
        for r, g in zip(ref, grads):
            r.grad = torch.tensor(g)
        theirs.step()
        for p, r in zip(params, ref):
            H.assert_close(p.full_tensor(), r.detach().numpy(), rtol=2e-6, atol=2e-6)
    assert [_address(p) for p in params] == addresses  # updated in place
    for p, state in zip(params, ours.state):  # state is laid out like its parameter
        for s in state.values():
            assert s.placements == p.placements and s.shape == p.shape


@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=0.1),
                                dict(weight_decay=0.05)], ids=["plain", "momentum", "nesterov_wd", "wd"])
def test_sgd_matches_torch(kw):
    _run_optimizer(lambda ps: meshfuse.optim.SGD(ps, lr=0.1, **kw), lambda ps: torch.optim.SGD(ps, lr=0.1, **kw))


@pytest.mark.parametrize("kw", [dict(), dict(eps=0.0), dict(betas=(0.8, 0.9), weight_decay=0.3)],
                         ids=["defaults", "eps0", "betas_wd"])
def test_adamw_matches_torch(kw):
    _run_optimizer(lambda ps: meshfuse.optim.AdamW(ps, lr=0.01, **kw),
                   lambda ps: torch.optim.AdamW(ps, lr=0.01, **kw))


def test_learning_rate_schedule_matches_torch():
    """group["lr"] set between steps (a linear decay), as with torch.optim; other options are
    compiled into the update and refused."""
    lrs = [0.05, 0.03, 0.01, 0.0]

    def schedule(opt):
        step = opt.step

        def scheduled(*args):
            for g in opt.param_groups:
                g["lr"] = lrs[scheduled.calls]
            scheduled.calls += 1
            return step(*args)
        scheduled.calls = 0
        opt.step = scheduled
        return opt

    _run_optimizer(lambda ps: schedule(meshfuse.optim.AdamW(ps, lr=1.0, weight_decay=0.1)),
                   lambda ps: schedule(torch.optim.AdamW(ps, lr=1.0, weight_decay=0.1)))
    opt = meshfuse.optim.SGD([meshfuse.distribute_tensor(np.zeros(3, np.float32), H.world_mesh(), [R])], lr=0.1)
    assert opt.param_groups[0]["lr"] == 0.1 and len(opt.param_groups[0]["params"]) == 1
    with pytest.raises(meshfuse.ValueError, match=r"SGD: only a parameter group's 'lr' can change between steps "
                                                  r"\(the other options are compiled into its update program\), "
                                                  r"not 'momentum'"):
        opt.param_groups[0]["momentum"] = 0.9


def test_bf16_parameters_keep_f32_masters():
    """torch's recipe: AdamW on an f32 master, the bf16 parameter its rounding."""
    rng = np.random.default_rng(1)
    mesh = H.world_mesh()
    full = torch.tensor(H.randn(rng, 8, 4))
    p = meshfuse.distribute_tensor(full.bfloat16(), mesh, _layouts()[0])
    master = full.bfloat16().float().clone().requires_grad_(True)
    opt, ref = meshfuse.optim.AdamW([p], lr=0.01), torch.optim.AdamW([master], lr=0.01)
    for _ in range(3):
        g = torch.tensor(H.randn(rng, 8, 4)).bfloat16()
        opt.step([meshfuse.distribute_tensor(g, mesh, _layouts()[0])])
        master.grad = g.float()
        ref.step()
        (state,) = opt.state
        H.assert_close(state["master"].full_tensor(), master.detach().numpy(), rtol=2e-6, atol=2e-6)
        assert torch.equal(torch.as_tensor(p.full_tensor()), master.detach().bfloat16())
    assert state["exp_avg"].dtype == DataType.Float


def _define_mlp_loss(fd):
    x, y = fd.define_tensor([8, 4]), fd.define_tensor([8, 4])
    w1, w2 = fd.define_tensor([16, 4]), fd.define_tensor([4, 16])
    err = fd.ops.sub(fd.ops.linear(fd.ops.gelu(fd.ops.linear(x, w1), approximate="tanh"), w2), y)
    fd.add_output(fd.ops.mean(fd.ops.mul(err, err), [0, 1]))


def _torch_mlp_loss(x, y, w1, w2):
    h = torch.nn.functional.gelu(x @ w1.T, approximate="tanh")
    return ((h @ w2.T - y) ** 2).mean()


PARALLELISMS = {  # placements of x, y, w1, w2
    "ddp": [[Shard(0)], [Shard(0)], [R], [R]],
    "megatron_tp": [[R], [R], [Shard(0)], [Shard(1)]],
}


@pytest.mark.world(1, 2, 4, 8)  # the world size divides the batch and hidden sizes
@pytest.mark.parametrize("parallelism", list(PARALLELISMS))
def test_sharded_training_matches_one_device(parallelism):
    """value_and_grad + AdamW, sharded on the world mesh, against torch on one device, step by step."""
    rng = np.random.default_rng(2)
    mesh, layout = H.world_mesh(), PARALLELISMS[parallelism]
    full = [H.randn(rng, 8, 4), H.randn(rng, 8, 4), 0.3 * H.randn(rng, 16, 4), 0.3 * H.randn(rng, 4, 16)]
    inputs = [meshfuse.distribute_tensor(a, mesh, p) for a, p in zip(full, layout)]
    fdw = meshfuse.FusionDefinitionWrapper(_define_mlp_loss)
    opt = meshfuse.optim.AdamW(inputs[2:], lr=0.01)
    ref = [torch.tensor(a, requires_grad=i >= 2) for i, a in enumerate(full)]
    torch_opt = torch.optim.AdamW(ref[2:], lr=0.01)
    for step in range(4):
        (loss,), grads = fdw.value_and_grad(inputs, wrt=[2, 3])
        opt.step(grads)
        torch_opt.zero_grad()
        expected = _torch_mlp_loss(*ref)
        expected.backward()
        torch_opt.step()
        H.assert_close(loss.full_tensor(), expected.item(), rtol=1e-5, atol=1e-6)
        for ours, theirs in zip(inputs[2:], ref[2:]):
            H.assert_close(ours.full_tensor(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)
    plan = fdw.plan(inputs, wrt=[2, 3], optimizer=opt)
    phases = [c.phase for c in plan.collectives()]
    assert set(phases) <= {"forward", "backward"}  # the update is local: state lies like its parameter
    if meshfuse.world_size() > 1 and parallelism == "ddp":  # one allreduce per weight gradient
        assert [c.kind for c in plan.collectives() if c.phase == "backward"].count("allreduce") == 2
    text = plan.host_ir()
    assert "# ----- forward program" in text and "# ----- optimizer program" in text


def train_side_by_side(f, full, steps, our_args, their_loss):
    """`steps` steps of torch.optim.AdamW over the parameters full[2:] (x, y first): ours through
    meshfuse's torch_interop callable `f` on our_args(tensors), theirs through pure torch's
    their_loss(*tensors); losses, gradients and the final weights must agree."""
    ours = [torch.tensor(a, requires_grad=i >= 2) for i, a in enumerate(full)]
    theirs = [torch.tensor(a, requires_grad=i >= 2) for i, a in enumerate(full)]
    opt_ours, opt_theirs = torch.optim.AdamW(ours[2:], lr=0.01), torch.optim.AdamW(theirs[2:], lr=0.01)
    for _ in range(steps):
        opt_ours.zero_grad()
        opt_theirs.zero_grad()
        (loss,) = f(*our_args(ours))
        loss.backward()
        expected = their_loss(*theirs)
        expected.backward()
        H.assert_close(loss.item(), expected.item(), rtol=1e-5, atol=1e-6)
        for a, b in zip(ours[2:], theirs[2:]):
            H.assert_close(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-6)
        opt_ours.step()
        opt_theirs.step()
    for a, b in zip(ours[2:], theirs[2:]):
        H.assert_close(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.world(1)  # plain torch tensors run on one device
def test_torch_autograd_trains_like_torch():
    """meshfuse's forward and backward inside a torch loop with torch.optim.AdamW (plain tensors:
    one device, so every rank runs it alone)."""
    rng = np.random.default_rng(3)
    full = [H.randn(rng, 8, 4), H.randn(rng, 8, 4), 0.3 * H.randn(rng, 16, 4), 0.3 * H.randn(rng, 4, 16)]
    f = meshfuse.torch_interop.autograd(meshfuse.FusionDefinitionWrapper(_define_mlp_loss))
    train_side_by_side(f, full, 5, lambda ts: ts, _torch_mlp_loss)


def test_optimizer_errors():
    mesh = H.world_mesh()
    w = meshfuse.distribute_tensor(np.zeros((4, 2), np.float32), mesh, [R])
    with pytest.raises(meshfuse.ValueError, match=r"SGD: params\[1\] is a numpy.ndarray, not a parameter"):
        meshfuse.optim.SGD([w, np.zeros(3, np.float32)], lr=0.1)
    ids = meshfuse.distribute_tensor(np.zeros(4, np.int64), mesh, [R])
    with pytest.raises(meshfuse.DtypeError, match=r"AdamW: params\[0\] is i64: only floating-point tensors"):
        meshfuse.optim.AdamW([ids], lr=0.1)
    opt = meshfuse.optim.SGD([w], lr=0.1)
    with pytest.raises(meshfuse.ValueError, match=r"SGD.step: got 2 gradients for 1 parameters"):
        opt.step([w, w])
    g = meshfuse.distribute_tensor(np.zeros((2, 4), np.float32), mesh, [R])
    with pytest.raises(meshfuse.ShapeError, match=r"grads\[0\] has shape \[2, 4\] but its parameter has shape \[4, 2\]"):
        opt.step([g])
    with pytest.raises(meshfuse.ValueError, match="SGD: nesterov momentum needs momentum > 0"):
        meshfuse.optim.SGD([w], lr=0.1, nesterov=True).step([w])


@pytest.mark.world(1, 2, 4, 8)  # the world size divides the hidden sizes
def test_torch_autograd_on_torch_dtensors_trains_like_torch():
    """The same loop on torch DTensors laid out Megatron-style on the world mesh: meshfuse derives
    the sharded forward and backward, torch.optim.AdamW steps the DTensor parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate as TR, Shard as TS, distribute_tensor

    meshfuse.torch_interop.init_process_group()
    mesh = init_device_mesh("cpu", (meshfuse.world_size(),))
    rng = np.random.default_rng(4)
    full = [H.randn(rng, 8, 4), H.randn(rng, 8, 4), 0.3 * H.randn(rng, 16, 4), 0.3 * H.randn(rng, 4, 16)]
    placements = [TR(), TR(), TS(0), TS(1)]
    ours = [distribute_tensor(torch.tensor(a), mesh, [p]) for a, p in zip(full, placements)]
    for w in ours[2:]:
        w.requires_grad_(True)
    theirs = [torch.tensor(a, requires_grad=i >= 2) for i, a in enumerate(full)]
    f = meshfuse.torch_interop.autograd(meshfuse.FusionDefinitionWrapper(_define_mlp_loss))
    opt_ours, opt_theirs = torch.optim.AdamW(ours[2:], lr=0.01), torch.optim.AdamW(theirs[2:], lr=0.01)
    for _ in range(3):
        opt_ours.zero_grad()
        opt_theirs.zero_grad()
        (loss,) = f(*ours)
        loss.backward()
        expected = _torch_mlp_loss(*theirs)
        expected.backward()
        H.assert_close(loss.full_tensor().item(), expected.item(), rtol=1e-5, atol=1e-6)
        assert ours[2].grad.placements == (TS(0),)
        opt_ours.step()
        opt_theirs.step()
    for a, b in zip(ours[2:], theirs[2:]):
        H.assert_close(a.detach().full_tensor().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.world(1, 2, 4, 8)  # the world size divides the parameter's rows
def test_optimizer_over_torch_dtensors():
    """meshfuse.optim.AdamW on torch DTensor parameters (sharded on the world mesh) against
    torch.optim.AdamW on the full tensors; the DTensors' local blocks are updated in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate as TR, Shard as TS, distribute_tensor

    meshfuse.torch_interop.init_process_group()
    mesh = init_device_mesh("cpu", (meshfuse.world_size(),))
    rng = np.random.default_rng(5)
    full = [H.randn(rng, 8, 3), H.randn(rng, 5)]
    placements = [TS(0), TR()]
    params = [distribute_tensor(torch.tensor(a), mesh, [p]) for a, p in zip(full, placements)]
    addresses = [p.to_local().data_ptr() for p in params]
    ref = [torch.tensor(a, requires_grad=True) for a in full]
    ours, theirs = meshfuse.optim.AdamW(params, lr=0.01, weight_decay=0.1), torch.optim.AdamW(ref, lr=0.01,
                                                                                             weight_decay=0.1)
    for _ in range(3):
        grads = [H.randn(rng, *a.shape) for a in full]
        ours.step([distribute_tensor(torch.tensor(g), mesh, [p]) for g, p in zip(grads, placements)])
        for r, g in zip(ref, grads):
            r.grad = torch.tensor(g)
        theirs.step()
        for p, r in zip(params, ref):
            H.assert_close(p.full_tensor().numpy(), r.detach().numpy(), rtol=2e-6, atol=2e-6)
    assert [p.to_local().data_ptr() for p in params] == addresses
    assert ours.state[0]["exp_avg"].placements == (TS(0),)
