"""FusionDefinition: defining, printing and scheduling fusions, and the errors of bad ones."""

import inspect

import pytest

import meshfuse
from meshfuse import DataType, DeviceMesh, FusionDefinition, ParallelType

REQUIRED_OPS = ["linear", "matmul", "add", "sub", "mul", "div", "neg", "exp", "log", "tanh", "sigmoid", "relu",
                "gelu", "silu", "rsqrt", "sum", "max", "mean", "reshape", "permute", "broadcast_in_dim", "cast", "set",
                "softmax", "layer_norm", "rms_norm", "sdpa"]


def test_the_issue_example_prints_its_fusion():
    h = 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, h], dtype=DataType.Float)
        up_w = fd.define_tensor([4 * h, h], dtype=DataType.Float)
        out = fd.ops.linear(inp, up_w)
        out = fd.ops.gelu(out, approximate="tanh")
        fd.add_output(out)
    assert str(fd) == (
        "fusion {\n"
        "  %0 = input f32[?s0, 8]\n"
        "  %1 = input f32[32, 8]\n"
        "  %2 = linear(%0, %1) : f32[?s0, 32, r8]\n"
        '  %3 = gelu(%2, approximate="tanh") : f32[?s0, 32]\n'
        "  output %3\n"
        "}\n")


@pytest.mark.parametrize("name", REQUIRED_OPS)
def test_every_required_op_exists(name):
    assert callable(getattr(FusionDefinition().ops, name))


def test_signatures_follow_pytorch():
    ops = FusionDefinition().ops
    sig = lambda f: str(inspect.signature(f))  # noqa: E731
    assert sig(ops.linear) == "(x, weight, bias=None)"
    assert sig(ops.sum) == "(x, dims, keepdim=False)"
    assert sig(ops.mean) == "(x, dims, keepdim=False)"
    assert sig(ops.layer_norm) == "(x, weight=None, bias=None, eps=1e-05)"
    assert sig(ops.rms_norm) == "(x, weight=None, eps=1e-06)"
    assert sig(ops.softmax) == "(x, dim)"
    assert sig(ops.sdpa) == "(query, key, value, is_causal=False, scale=None)"
    assert sig(ops.permute) == "(x, dims)"
    assert sig(ops.gelu) == "(x, approximate='none')"


def test_shapes_dtypes_scalars_and_operators():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 6], dtype=DataType.BFloat16, name="x")
        w = fd.define_tensor([4, 6], dtype=DataType.BFloat16)
        y = fd.ops.linear(x, w)
        assert y.shape == [-1, 4] and y.dtype == DataType.BFloat16 and y.ndim == 2
        z = 2.0 * fd.ops.relu(y) - 1 + y / 3
        assert z.shape == [-1, 4]
        s = fd.ops.sum(z, [1], keepdim=True)
        assert s.shape == [-1, 1]
        m = fd.ops.mean(z, dims=[0, 1])
        assert m.shape == []
        assert fd.ops.max(z, 1).shape == [-1] and fd.ops.sum(z, dim=0, keepdim=True).shape == [1, 4]
        c = fd.ops.cast(z, DataType.Float)
        assert c.dtype == DataType.Float
        r = fd.ops.reshape(c, new_shape=[-1, 2, 2])
        p = fd.ops.permute(r, [2, 0, 1])
        assert p.shape == [2, -1, 2]
        b = fd.ops.broadcast_in_dim(fd.define_tensor([4], dtype=DataType.Half), [3, 4], [1])
        assert b.shape == [3, 4]
        fd.add_output(p)
    assert "%x = input bf16[?s0, 6]" in str(fd)


def test_sdpa_takes_torch_layout_and_causal_flag():
    with FusionDefinition() as fd:
        q = fd.define_tensor([2, 4, 8, 16])
        k = fd.define_tensor([2, 4, 8, 16])
        v = fd.define_tensor([2, 4, 8, 16])
        o = fd.ops.sdpa(q, k, v, is_causal=True, scale=None)
        fd.add_output(o)
    assert o.shape == [2, 4, 8, 16]
    assert "is_causal=true" in str(fd)


def test_schedule_api_pins_a_tensor():
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        w = fd.define_tensor([8, 4], name="w")
        w.set_device_mesh(mesh)
        w.split(0, 1)
        axis = w.axis(0)
        assert axis.extent == 1
        axis.parallelize(ParallelType.mesh_x)
        assert w.axis(0).parallel_type == ParallelType.mesh_x
        assert w.placements == (meshfuse.Shard(0),) and w.mesh == mesh
        fd.add_output(fd.ops.relu(w))
    assert "%w = input f32[8, 4] @m0 {split(0, 1), parallelize(0, DIDx)}" in str(fd)


def test_axis_keeps_naming_its_iter_domain_after_other_splits():
    with FusionDefinition() as fd:
        t = fd.define_tensor([8, 6])
        t.set_device_mesh(DeviceMesh([0]))
        t.split(1, 1)  # [8, 1, 6]
        outer = t.axis(1)
        t.split(0, 1)  # [1, 8, 1, 6]: outer is loop axis 2 now
        outer.parallelize(ParallelType.mesh_x)
        assert t.axis(2).parallel_type == ParallelType.mesh_x
        assert t.placements == (meshfuse.Shard(1),)
        fd.add_output(t)


def test_a_shape_mismatch_is_a_shape_error_naming_both_operands():
    with FusionDefinition() as fd:
        a = fd.define_tensor([4, 8], name="a")
        b = fd.define_tensor([4, 6], name="b")
        with pytest.raises(meshfuse.ShapeError) as e:
            fd.ops.add(a, b)
    assert isinstance(e.value, meshfuse.Error)
    assert "add" in str(e.value) and "%a" in str(e.value) and "%b" in str(e.value)


def test_bad_op_arguments_are_value_errors():
    fd = FusionDefinition()
    x = fd.define_tensor([4, 8])
    with pytest.raises(meshfuse.ValueError, match=r'gelu: approximate must be "none" or "tanh" but is "fast"'):
        fd.ops.gelu(x, approximate="fast")
    with pytest.raises(meshfuse.ValueError, match=r"sum: attribute 'dims' must be a list of ints, got 'a'"):
        fd.ops.sum(x, "a")
    with pytest.raises(meshfuse.ValueError, match=r"an operand must be a TensorView or a Python number, got str"):
        fd.ops.add(x, "one")
    other = FusionDefinition().define_tensor([4, 8], name="y")
    with pytest.raises(meshfuse.ValueError, match=r"add: operand %y belongs to another FusionDefinition"):
        fd.ops.add(x, other)
    with pytest.raises(meshfuse.ValueError, match=r"define_tensor: dtype must be a meshfuse.DataType"):
        fd.define_tensor([4], dtype="float32")


def test_schedule_errors_name_the_tensor():
    fd = FusionDefinition()
    t = fd.define_tensor([8, 4], name="t")
    with pytest.raises(meshfuse.Error, match=r"%t"):
        t.split(5, 2)
    with pytest.raises(meshfuse.ValueError, match=r"%t: axis 7 is out of range for a loop domain of 2 axes"):
        t.axis(7)
    t.set_device_mesh(DeviceMesh([0]))
    with pytest.raises(meshfuse.PlacementError, match=r"mesh_y|DIDy"):
        t.axis(0).parallelize(ParallelType.mesh_y)  # a 1-d mesh has only mesh_x


def test_error_classes_are_generated_from_the_cpp_list():
    for name in ["ParseError", "ShapeError", "DtypeError", "NameError", "MeshError", "PlacementError",
                 "UnsupportedError", "ValueError", "RuntimeError"]:
        cls = getattr(meshfuse, name)
        assert issubclass(cls, meshfuse.Error) and cls.__module__ == "meshfuse"


def test_mesh_and_placements_of_a_tensor_view():
    """None until the schedule gives a mesh; then meshfuse's own classes, printed as the user wrote them."""
    mesh = DeviceMesh([0])
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 6], name="t")
        assert t.mesh is None and t.placements is None
        t.set_device_mesh(mesh)
        assert t.placements == (meshfuse.Replicate(),) and repr(t.placements) == "(Replicate(),)"
        t.split(1, 1)
        t.axis(1).parallelize(ParallelType.mesh_x)
        assert isinstance(t.mesh, DeviceMesh) and t.mesh == mesh and repr(t.mesh) == "DeviceMesh([0])"
        assert repr(t.placements) == "(Shard(dim=1),)" and isinstance(t.placements[0], meshfuse.Shard)
        fd.add_output(t)


def test_tensor_views_compare_like_torch_tensors_and_hash_by_identity():
    fd = FusionDefinition()
    x, y = fd.define_tensor([4], name="x"), fd.define_tensor([4], name="y")
    eq = x == y
    assert isinstance(eq, meshfuse.TensorView) and eq.dtype == DataType.Bool and "eq(%x, %y)" in str(fd)
    assert (x == None) is False and (x != None) is True  # noqa: E711 (not an operand: identity, as for objects)
    assert {x: "x", y: "y"}[fd.inputs[0]] == "x" and x in {x} and y not in {x}
    with pytest.raises(meshfuse.ValueError, match=r"^the truth value of TensorView %\d+ is not known while the fusion "
                                                  r"is defined: use fd.ops.where\(cond, a, b\)"):
        bool(x > 0)
    with pytest.raises(meshfuse.ValueError, match="truth value"):
        if x == y:
            pass


def test_sdpa_scale_zero_is_rejected_not_read_as_the_default():
    fd = FusionDefinition()
    q = fd.define_tensor([1, 2, 8, 16])
    with pytest.raises(meshfuse.ValueError, match=r"^sdpa: scale=0.0 is not supported \(meshfuse reads it as the "
                                                  r"default, 1/sqrt\(head size\)\): pass scale=None for that, or a "
                                                  r"nonzero scale$"):
        fd.ops.sdpa(q, q, q, scale=0.0)


def test_matrix_vector_products_are_clear_shape_errors():
    """The GEMM ops take matrices (batched); a vector operand is not broadcast as in torch."""
    fd = FusionDefinition()
    m, v = fd.define_tensor([4, 6], name="m"), fd.define_tensor([6], name="v")
    with pytest.raises(meshfuse.ShapeError, match=r"^matmul: operands must have rank >= 2 but %m has shape \[4, 6\] "
                                                  r"and %v has shape \[6\]$"):
        fd.ops.matmul(m, v)
    with pytest.raises(meshfuse.ShapeError, match=r"^linear: weight %v must have rank 2 but has shape \[6\]$"):
        fd.ops.linear(m, v)
