"""The workloads benchmarks/perf.py times: one computation as a call per path.

Each builder returns a :class:`Workload` whose calls run the same computation
through eager, Inductor, tpu and ``jax.jit`` (the models are in
``perf_models.py``). Imported by perf.py after it has set (or left alone) the
thread and allocator settings, which torch and XLA read when they load.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch
import torch._inductor.config
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.paired_rounds import Call
from benchmarks.perf_models import (
    LEARNING_RATE,
    MLP,
    Params,
    _mobilenet,
    _resnet,
    _seeded,
    Decoder,
    decoder_jax,
    mlp_jax,
    mlp_sgd_step_jax,
    mobilenet_jax,
    resnet_jax,
    to_jax,
)

PATHS = ("eager", "inductor", "tpu", "jax")
OTHERS = ("eager", "inductor", "jax")  # what tpu is compared with
COMPILED = ("inductor", "tpu", "jax")
TORCH_PATHS = ("eager", "inductor", "tpu")
LABELS = {"eager": "eager", "inductor": "Inductor", "tpu": "tpu", "jax": "jax.jit"}
TPU_OPTIONS = {"cache": False}


@dataclasses.dataclass
class Workload:
    """One computation as a zero-argument call per path; compiles happen at the first call."""

    name: str
    description: str
    calls: dict[str, Call]
    grad: bool = False


def compile_for(path: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if path == "inductor":
        return torch.compile(fn, backend="inductor")
    if path == "tpu":
        return torch.compile(fn, backend="tpu", options=TPU_OPTIONS)
    return fn


def torch_calls(fn: Callable[..., Any], *args: Any) -> dict[str, Call]:
    """eager / inductor / tpu calls of ``fn(*args)``."""
    return {path: functools.partial(compile_for(path, fn), *args) for path in TORCH_PATHS}


def jax_call(fn: Callable[..., jax.Array], *args: Any) -> Call:
    jitted = jax.jit(fn)
    return lambda: jitted(*args).block_until_ready()


def add_one(x: Any) -> Any:
    return x + 1


def overhead_workload() -> Workload:
    x = torch.zeros(4)
    return Workload(
        "overhead", "per-call overhead: `x + 1`, x of shape (4,)",
        {**torch_calls(add_one, x), "jax": jax_call(add_one, jnp.asarray(x.numpy()))},
    )


CNN_IMAGES = (16, 3, 32, 32)
MOBILENET_IMAGES = (8, 3, 64, 64)


def mlp_inputs(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 1024, generator=torch.Generator().manual_seed(seed))


def decoder_tokens(batch: int = 4, length: int = 128) -> torch.Tensor:
    return torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(1))


def random_images(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def mlp_workload() -> Workload:
    model, x = _seeded(MLP).eval(), mlp_inputs(64)
    return Workload(
        "mlp", "MLP 3x1024, batch 64",
        {**torch_calls(model, x), "jax": jax_call(mlp_jax, to_jax(model), jnp.asarray(x.numpy()))},
    )


def decoder_workload(name: str = "decoder", batch: int = 4, length: int = 128, description: str = "") -> Workload:
    model = _seeded(Decoder).eval()
    tokens = decoder_tokens(batch, length)
    forward = functools.partial(decoder_jax, heads=4, layers=len(model.blocks))
    return Workload(
        name, description or f"decoder 2 blocks, d=256, 4 heads, seq {length}, batch {batch}",
        {
            **torch_calls(model, tokens),
            "jax": jax_call(forward, to_jax(model), jnp.asarray(tokens.numpy(), jnp.int32)),
        },
    )


def image_workload(
    name: str, description: str, model: nn.Module, forward_jax: Callable[..., jax.Array], shape: tuple[int, ...]
) -> Workload:
    """``model`` and its JAX version on one batch of random images."""
    images = random_images(shape)
    jax_images = jnp.asarray(images.numpy())
    return Workload(
        name, description, {**torch_calls(model, images), "jax": jax_call(forward_jax, to_jax(model), jax_images)}
    )


def cnn_workload() -> Workload:
    return image_workload("cnn", "ResNet-style CNN 32x32, batch 16", _resnet(), resnet_jax, CNN_IMAGES)


def mobilenet_workload() -> Workload:
    description = "MobileNetV3-style CNN (depthwise 3x3/5x5, squeeze-excite) 64x64, batch 8"
    return image_workload("mobilenet", description, _mobilenet(), mobilenet_jax, MOBILENET_IMAGES)


def frozen_calls(model: nn.Module, jax_forward: Callable[..., jax.Array], *inputs: torch.Tensor) -> dict[str, Call]:
    """Each path with its parameters frozen: Inductor's ``freezing``, tpu's
    ``freeze_parameters``, JAX with the parameters closed over as constants."""
    inductor = torch.compile(model, backend="inductor")
    frozen_inductor = _first_call_under(torch._inductor.config.patch(freezing=True), inductor)
    tpu = torch.compile(model, backend="tpu", options={**TPU_OPTIONS, "freeze_parameters": True})
    return {
        "eager": functools.partial(model, *inputs),
        "inductor": functools.partial(frozen_inductor, *inputs),
        "tpu": functools.partial(tpu, *inputs),
        "jax": jax_call(
            functools.partial(jax_forward, to_jax(model)), *(jnp.asarray(t.numpy()) for t in inputs)
        ),
    }


def mlp_frozen_workload() -> Workload:
    model = _seeded(MLP).eval()
    return Workload("mlp_frozen", "MLP 3x1024, batch 64, parameters frozen", frozen_calls(model, mlp_jax, mlp_inputs(64)))


def cnn_frozen_workload() -> Workload:
    return Workload(
        "cnn_frozen", "ResNet-style CNN, parameters frozen", frozen_calls(_resnet(), resnet_jax, random_images(CNN_IMAGES))
    )


def _first_call_under(context: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its first call (where torch.compile compiles) inside ``context``."""
    compiled = []

    def call(*args: Any) -> Any:
        if compiled:
            return fn(*args)
        with context:
            result = fn(*args)
        compiled.append(True)
        return result

    return call


def torch_train_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> Callable[[], torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def jax_train_call(params: Params, x: jax.Array, y: jax.Array) -> Call:
    step = jax.jit(mlp_sgd_step_jax, donate_argnums=0)
    state = [params]

    def call() -> jax.Array:
        state[0], loss = step(state[0], x, y)
        return jax.block_until_ready((state[0], loss))[1]

    return call


def train_workload() -> Workload:
    """Every path trains its own copy of one initialisation on the same batch."""
    x, y = mlp_inputs(64), mlp_inputs(64, seed=2)
    calls = {path: compile_for(path, torch_train_step(_seeded(MLP), x, y)) for path in TORCH_PATHS}
    jax_x, jax_y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    calls["jax"] = jax_train_call(to_jax(_seeded(MLP)), jax_x, jax_y)
    return Workload("train", "MLP train step (fwd + bwd + SGD), batch 64", calls, grad=True)


BUILDERS: dict[str, Callable[[], Workload]] = {
    "overhead": overhead_workload,
    "mlp": mlp_workload,
    "decoder": decoder_workload,
    "decode": functools.partial(
        decoder_workload, "decode", 1, 1, "decoder on one token, batch 1 (a generation step's shape)"
    ),
    "cnn": cnn_workload,
    "mobilenet": mobilenet_workload,
    "mlp_frozen": mlp_frozen_workload,
    "cnn_frozen": cnn_frozen_workload,
    "train": train_workload,
}
