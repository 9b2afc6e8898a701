"""examples/python/tiny_gpt.py: the tiny GPT's loss and every parameter's gradient (value_and_grad)
against the same model in PyTorch (torch.autograd, f64), replicated and with the batch sharded
over the world (1, 2, 4 ranks under pytest_np*)."""

import os
import sys

import numpy as np
import pytest
import torch

import meshfuse
from meshfuse import FusionDefinitionWrapper, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import tiny_gpt  # noqa: E402

import helpers as H  # noqa: E402


@pytest.mark.parametrize("batch_placement", [Replicate(), Shard(0)], ids=["replicated", "data_parallel"])
def test_tiny_gpt_gradients_match_torch(batch_placement):
    n = meshfuse.world_size()
    c = tiny_gpt.Config(batch=2 * n)
    params = tiny_gpt.init_params(c)
    tokens, targets = tiny_gpt.batch(c)
    mesh = H.world_mesh()
    inputs = [distribute_tensor(a, mesh, [Replicate()]) for a in params.values()]
    inputs += [distribute_tensor(a, mesh, [batch_placement]) for a in (tokens, targets)]
    fdw = FusionDefinitionWrapper(tiny_gpt.define_tiny_gpt(c))
    (loss,), grads = fdw.value_and_grad(inputs, list(range(len(params))))

    tp = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    want = tiny_gpt.torch_loss(c, tp, torch.tensor(tokens), torch.tensor(targets))
    want.backward()
    H.assert_close(np.asarray(loss.full_tensor()), want.item(), rtol=1e-5, atol=1e-5)
    for (name, _), g in zip(params.items(), grads):
        np.testing.assert_allclose(np.asarray(g.full_tensor(), np.float64), tp[name].grad.numpy(), rtol=1e-4,
                                   atol=2e-5, err_msg=name)
