"""Several devices in one process: every island compiled once for a device mesh
through XLA's SPMD partitioner (jaxlib's CPU client makes the devices).

Each test compares against single-device eager PyTorch. The numbers alone
would also match if everything ran on one device, so each test also checks
the report: the islands were compiled for the mesh, with the shardings and
the collectives XLA inserted (counted from the compiled HLO), and ``strict``
makes any op left to eager an error.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

import tpu_inductor
import tpu_inductor.report as report
from tpu_inductor.config import Config
from tpu_inductor.errors import ConfigError
from tpu_inductor.process_state import STATE
from tpu_inductor.runtime.mesh import Mesh, parse_mesh

from new_process import fresh_process

DATA4 = {"mesh": {"data": 4}, "strict": True}
# One float32 ulp of the losses here is ~1e-7; partial sums add in another
# order on each device count, so a few ulps apart.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(layer, torch.nn.Linear(32, 8))


def _inputs(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(model[0], torch.nn.TransformerEncoderLayer):
        return torch.randn(8, 6, 32), torch.randn(8, 6, 8)
    return torch.randn(8, 16), torch.randn(8, 4)


def train(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int = 5) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def graph(kind: str) -> report.GraphRecord:
    return next(g for g in report.current().graphs if g.kind == kind)


def hlo(island: report.IslandRecord) -> str:
    """The compiled program of an island, as XLA optimised it."""
    return "\n".join(m.to_string() for m in STATE.executables[island.cache_key].hlo_modules())


def all_gathered_parameters(text: str) -> list[str]:
    """The HLO parameters an all-gather reads directly."""
    parameters = set(re.findall(r"(%[\w.-]+) = \S+ parameter\(\d+\)", text))
    gathered = re.findall(r"all-gather(?:-start)?\((%[\w.-]+)", text)
    return [name for name in gathered if name in parameters]


# -- the mesh --------------------------------------------------------------------


def test_the_mesh_is_an_option_and_an_environment_variable():
    assert Config.load({"mesh": {"data": 2, "model": 2}}).mesh == (("data", 2), ("model", 2))
    assert Config.load({}, environ={"TPU_INDUCTOR_MESH": "data=4"}).mesh == (("data", 4),)
    assert Config.load({}, environ={}).mesh == ()
    for bad in ("data", "data=0", "data=2,data=2", {"data": "x"}, 4):
        with pytest.raises(ConfigError, match="mesh"):
            Config.load({"mesh": bad})


def test_shardings_name_the_devices_of_each_part():
    mesh = Mesh(parse_mesh("data=2,model=2"), tuple(range(4)))
    assert mesh.hlo_sharding(("data", None)) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert mesh.hlo_sharding((None, "model")) == "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
    assert mesh.hlo_sharding(("data", "model")) == "{devices=[2,2]0,1,2,3}"
    assert mesh.hlo_sharding((None, None)) == "{replicated}"
    x = torch.arange(16.0).reshape(4, 4)
    # Device 1 is data 0, model 1: rows 0-1 whole, columns 2-3.
    torch.testing.assert_close(mesh.shard(x, ("data", None), 1), x[:2])
    torch.testing.assert_close(mesh.shard(x, (None, "model"), 1), x[:, 2:])
    assert mesh.fit(("data",), (3, 4)) == (None, None)  # 2 does not divide 3: replicated


def test_a_compiled_results_sharding_reads_back_as_the_parts_each_device_holds():
    from tpu_inductor.runtime.jaxlib_api import hlo_sharding_from_string
    from tpu_inductor.runtime.sharded import result_parts, spec_of

    mesh = Mesh(parse_mesh("data=2,model=2"), tuple(range(4)))
    x = torch.arange(24.0).reshape(4, 6)
    for spec in [("data", None), (None, "model"), ("model", "data"), (None, None)]:
        sharding = hlo_sharding_from_string(mesh.hlo_sharding(spec))
        assert spec_of(mesh, sharding, x.shape) == spec
        parts = result_parts(sharding, x.shape)
        if parts is None:
            continue
        # One device per distinct part, holding what Mesh.shard cuts for it.
        assert len(parts) == 4 // (2 if None in spec else 1)
        for device, slices in parts:
            torch.testing.assert_close(x[slices], mesh.shard(x, spec, device))
    # XLA pads an uneven tile; the last part is cut to the whole.
    uneven = result_parts(hlo_sharding_from_string("{devices=[4]0,1,2,3}"), (6,))
    assert [s for _, (s,) in uneven] == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 6)]
    assert spec_of(mesh, hlo_sharding_from_string("{devices=[4]0,1,2,3}"), (8,)) is None  # no one axis of 4


def test_a_mesh_larger_than_the_platform_is_a_clear_error():
    compiled = torch.compile(lambda a: a + 1, backend="tpu", options={"mesh": {"data": 4}, "platform": "cpu"})
    compiled(torch.randn(8))  # the CPU client makes the mesh's devices
    torch._dynamo.reset()
    from tpu_inductor.runtime.mesh import mesh_over
    from tpu_inductor.runtime.platform import get_platform

    with pytest.raises(ConfigError, match="needs 8 devices.*'mesh' option"):
        mesh_over((("data", 8),), get_platform("cpu", num_devices=4))


# -- single controller: inference and training ---------------------------------


@pytest.mark.parametrize("make", [mlp, transformer])
def test_data_parallel_inference_matches_eager(make):
    torch.manual_seed(0)
    model = make().eval()
    x, _ = _inputs(model)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="tpu", options=DATA4)(x)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    record = graph("inference")
    assert record.mesh == "data=4" and record.islands and not record.fallbacks
    assert "{devices=[4" in " ".join(record.islands[0].shardings["inputs"])  # the batch is split


@pytest.mark.parametrize("make", [mlp, transformer])
def test_data_parallel_training_matches_single_device_eager(make):
    torch.manual_seed(0)
    model = make()
    reference = copy.deepcopy(model)
    x, target = _inputs(model)
    compiled_losses = train(torch.compile(model, backend="tpu", options=DATA4), x, target)
    eager_losses = train(reference, x, target)
    torch.testing.assert_close(compiled_losses, eager_losses, **TOLERANCE)
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, expected, **TOLERANCE)
    backward = graph("backward")
    assert backward.mesh == "data=4" and not backward.fallbacks
    # The gradients of the split batch are summed by XLA's all-reduce
    # (XLA:CPU combines them into one), and no parameter is gathered.
    assert backward.islands[0].collectives.get("all-reduce", 0) >= 1
    for island in graph("forward").islands + backward.islands:
        assert all_gathered_parameters(hlo(island)) == []


def test_parameters_cross_to_the_mesh_once_on_a_copying_client(monkeypatch):
    """``zero_copy=False`` (a TPU's path): each parameter's parts go to the
    devices once, and again only after an optimizer step changes it; a new
    batch crosses at every call; the activations the forward saves stay on the
    devices for the backward. Trains against single-device eager."""
    from tpu_inductor.runtime import transfer
    from tpu_inductor.runtime.executable import resident_buffers
    from tpu_inductor.runtime.platform import get_platform

    uploaded: list[tuple[int, ...]] = []
    upload = transfer.upload
    monkeypatch.setattr(transfer, "upload", lambda t, device: (uploaded.append(tuple(t.shape)), upload(t, device))[1])

    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tpu", options={**DATA4, "zero_copy": False})
    resident = resident_buffers(get_platform("cpu", zero_copy=False, num_devices=4))
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(8, 16)
            torch.testing.assert_close(compiled(x), reference(x), **TOLERANCE)
    assert [resident.uploads[id(p)] for p in model.parameters()] == [1] * 4
    x, target = _inputs(model)
    uploaded.clear()
    torch.testing.assert_close(train(compiled, x, target, steps=3), train(reference, x, target, steps=3), **TOLERANCE)
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, expected, **TOLERANCE)
    # Training: the first step's forward and backward read the copies made for
    # inference; each of the two later steps follows an update: 1 + 2 uploads.
    assert [resident.uploads[id(p)] for p in model.parameters()] == [3] * 4
    # A quarter of the batch per device: the input crosses at the first step,
    # and no activation the forward saved (8 / 4 rows of 32) crosses back.
    assert uploaded.count((2, 16)) == 4 and uploaded.count((2, 32)) == 0


def test_data_parallel_mlp_backward_has_one_all_reduce_and_no_all_gather():
    torch.manual_seed(0)
    x, target = torch.randn(8, 16), torch.randn(8, 4)
    train(torch.compile(mlp(), backend="tpu", options=DATA4), x, target, steps=1)
    (island,) = graph("backward").islands
    assert island.collectives == {"all-reduce": 1}
    assert island.shardings["outputs"] == ["{replicated}"] * 4  # the four gradients, whole


def test_results_stay_split_where_xla_computed_them_split():
    """An activation computed per device is returned split and put together on
    the host, not all-gathered in the program; a backward takes what its
    forward saved split the same way (results replicated before: the MLP's
    forward held 2 all-gathers, the transformer's 12 and its backward 3)."""
    torch.manual_seed(0)
    x, target = torch.randn(8, 16), torch.randn(8, 4)
    train(torch.compile(mlp(), backend="tpu", options=DATA4), x, target, steps=1)
    (forward,) = graph("forward").islands
    assert forward.collectives == {}
    assert forward.shardings["outputs"] == ["{devices=[4,1]<=[4]}"] * 2  # the output and the saved ReLU
    (backward,) = graph("backward").islands
    assert "{devices=[4,1]0,1,2,3}" in backward.shardings["inputs"]  # the saved ReLU, split as saved
    torch._dynamo.reset()
    report.reset()
    model = transformer()
    x, target = _inputs(model)
    train(torch.compile(model, backend="tpu", options=DATA4), x, target, steps=1)
    gathers = sum(i.collectives.get("all-gather", 0) for g in report.current().graphs for i in g.islands)
    assert gathers <= 3, gathers


def test_a_split_result_is_put_together_from_each_part_where_xla_put_it():
    """Results XLA splits in ways of its own (a transposed split, a flattened
    one, over two axes with copies) come back whole and exact."""
    two_axes = {"mesh": {"data": 2, "model": 2}, "strict": True}
    cases = [
        (lambda x: (x + 1).t(), DATA4, "{devices=[1,4]<=[4]}"),
        (lambda x: x.sin().reshape(-1), DATA4, "{devices=[4]<=[4]}"),
        (lambda x: torch.cat([x, x[:2]]) + 1, DATA4, None),
    ]
    for function, options, sharding in cases:
        torch._dynamo.reset()
        report.reset()
        x = torch.randn(8, 3)
        got = torch.compile(function, backend="tpu", options=options)(x)
        torch.testing.assert_close(got, function(x), rtol=0, atol=0)
        (island,) = graph("inference").islands
        assert sharding is None or island.shardings["outputs"] == [sharding]
    torch._dynamo.reset()
    report.reset()
    x, weight = torch.randn(8, 3), torch.randn(3, 8)
    tpu_inductor.shard(weight, (None, "model"))
    function = lambda x, w: (x @ w).relu()  # noqa: E731
    got = torch.compile(function, backend="tpu", options=two_axes)(x, weight)
    torch.testing.assert_close(got, function(x, weight), **TOLERANCE)
    (island,) = graph("inference").islands
    assert "last_tile_dim_replicate" in island.shardings["outputs"][0] and island.collectives == {}


def test_a_caller_asks_for_each_devices_part_of_a_result():
    """``tpu_inductor.shards(result)``: per device of the mesh, the slices of the
    whole result it holds as XLA compiled it, and that part; devices that hold
    copies get the same slices. A value computed afterwards has no parts."""
    torch.manual_seed(0)
    model = mlp().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        out = torch.compile(model, backend="tpu", options=DATA4)(x)
        expected = model(x)
    parts = tpu_inductor.shards(out)
    assert [p.position for p in parts] == [{"data": i} for i in range(4)]
    assert len({p.device.id for p in parts}) == 4
    assert [p.index[0] for p in parts] == [slice(2 * i, 2 * i + 2) for i in range(4)]
    for part in parts:
        torch.testing.assert_close(part.data, expected[part.index], **TOLERANCE)

    torch._dynamo.reset()
    x, weight = torch.randn(8, 3), torch.randn(3, 8)
    tpu_inductor.shard(weight, (None, "model"))
    two_axes = {"mesh": {"data": 2, "model": 2}, "strict": True}
    split, total = torch.compile(lambda x, w: ((x @ w).relu(), (x @ w).sum()), backend="tpu", options=two_axes)(
        x, weight
    )
    # The product's columns are split over model, and both devices along data
    # hold a copy of each half.
    by_position = {(p.position["data"], p.position["model"]): p.index for p in tpu_inductor.shards(split)}
    assert by_position == {(d, m): (slice(0, 8), slice(4 * m, 4 * m + 4)) for d in (0, 1) for m in (0, 1)}
    # A sum over everything is replicated: each device holds all of it.
    assert [p.data.shape for p in tpu_inductor.shards(total)] == [torch.Size([])] * 4
    with pytest.raises(ValueError, match="not returned by a graph compiled for a device mesh"):
        tpu_inductor.shards(split + 1)

    # Dynamic shapes: a batch of 12 runs in the bucket of 16, 4 rows a device,
    # and the last device holds only padding.
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tpu", options=DATA4, dynamic=True)
    x = torch.randn(12, 16)
    with torch.no_grad():
        out, expected = compiled(x), model(x)
    parts = tpu_inductor.shards(out)
    assert [p.index[0] for p in parts] == [slice(0, 4), slice(4, 8), slice(8, 12), slice(12, 12)]
    assert parts[3].data.numel() == 0
    for part in parts:
        torch.testing.assert_close(part.data, expected[part.index], **TOLERANCE)


def test_a_result_sharding_that_cannot_be_read_compiles_again_with_whole_results(monkeypatch):
    import tpu_inductor.runtime.sharded as sharded

    def unreadable(sharding, shape):
        if sharding.is_replicated():
            return None
        raise sharded.UnreadableSharding(f"a result sharded as {sharding} (test)")

    monkeypatch.setattr(sharded, "device_slices", unreadable)
    model = mlp().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="tpu", options=DATA4)(x)
        torch.testing.assert_close(got, model(x), **TOLERANCE)
    (island,) = graph("inference").islands
    assert island.shardings["outputs"] == ["{replicated}"] and island.collectives == {"all-gather": 1}


def test_a_shard_hint_splits_a_parameter_over_the_model_axis():
    """Tensor parallel pair: the first Linear split by output features, the
    second by input features, over ``model``; the batch over ``data``."""
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    tpu_inductor.shard(model[0].weight, ("model", None))
    tpu_inductor.shard(model[0].bias, ("model",))
    tpu_inductor.shard(model[2].weight, {"data": 2, "model": 2}, (None, "model"))  # the mesh may be named
    x, target = _inputs(model)
    options = {"mesh": {"data": 2, "model": 2}, "strict": True}
    compiled_losses = train(torch.compile(model, backend="tpu", options=options), x, target)
    torch.testing.assert_close(compiled_losses, train(reference, x, target), **TOLERANCE)
    forward = graph("forward").islands[0]
    assert "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}" in forward.shardings["inputs"]
    assert forward.collectives  # the split matmuls' results meet in collectives


def test_a_mesh_executable_comes_back_from_the_disk_cache(tmp_path):
    torch.manual_seed(0)
    model = mlp().eval()
    x = torch.randn(8, 16)
    options = {**DATA4, "cache": True, "cache_dir": str(tmp_path)}
    STATE.reset()  # nothing from earlier tests in memory: the first compile stores its executable
    with torch.no_grad():
        first = torch.compile(model, backend="tpu", options=options)(x)
        fresh_process()
        second = torch.compile(model, backend="tpu", options=options)(x)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    (island,) = graph("inference").islands
    # The disk's executable is the mesh's: its result split as XLA chose.
    assert island.compile_source == "disk" and island.shardings["outputs"] == ["{devices=[4,1]<=[4]}"]


def test_a_hint_for_another_mesh_or_axis_is_a_clear_error():
    model = mlp()
    tpu_inductor.shard(model[0].weight, {"data": 8}, ("data", None))
    with pytest.raises(Exception, match="mesh {'data': 8}.*compiles for the mesh {'data': 4}"):
        torch.compile(model, backend="tpu", options=DATA4)(torch.randn(8, 16))
    torch._dynamo.reset()
    tpu_inductor.shard(model[0].weight, ("model", None))
    with pytest.raises(Exception, match=r"axes \['model'\] that the mesh"):
        torch.compile(model, backend="tpu", options=DATA4)(torch.randn(8, 16))
    with pytest.raises(TypeError, match="per dim"):
        tpu_inductor.shard(model[0].weight, "model")


def test_a_hugging_face_causal_lm_trains_data_parallel():
    """The batch is found among the inputs beside buffers (rotary inv_freq) and labels."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 128, (4, 16))
    compiled = torch.compile(model, backend="tpu", options={"mesh": {"data": 2}, "strict": True})
    for _ in range(2):
        for m in (compiled, reference):
            m(ids, labels=ids).loss.backward()
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-6)
    assert "{devices=[2" in " ".join(graph("forward").islands[0].shardings["inputs"])
    assert graph("backward").islands[0].collectives.get("all-reduce", 0) >= 1


def test_graphs_with_dynamic_shapes_compile_each_bucket_for_the_mesh():
    torch.manual_seed(0)
    model = mlp()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tpu", options={"mesh": {"data": 2}, "strict": True}, dynamic=True)
    for batch in (6, 8, 12):
        x = torch.randn(batch, 16)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, **TOLERANCE)
    assert report.current().dynamic_graphs
    forward = graph("forward")
    assert forward.mesh == "data=2" and all("{devices=[2,1]0,1}" in i.shardings["inputs"] for i in forward.islands)
