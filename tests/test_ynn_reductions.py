"""XLA:CPU runs a module's reductions in its own loops, not YNNPACK's, where
one of them is short (runtime/ynn_reductions.py); results never change."""

from __future__ import annotations

import re

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor.report as report
from tpu_inductor.lowering.stablehlo import lower_to_stablehlo
from tpu_inductor.runtime import get_platform, jaxlib_api, ynn_reductions
from tpu_inductor.runtime.executable import _compile_options, compile_stablehlo
from tpu_inductor.runtime.isolated_compile import compile_and_load


def _pooled_then_projected(x, w):
    # A squeeze-excite block's shape: pool over 4x4 pixels, then a 1x1 convolution as a product.
    return (x.exp().mean(dim=(2, 3)) @ w,)


def _normalised_rows(x, w):
    # A layer norm's shape: rows of 256.
    return (torch.softmax(x, dim=-1) @ w,)


_SHORT = (torch.randn(8, 576, 4, 4), torch.randn(576, 144) / 24)
_LONG = (torch.randn(512, 256), torch.randn(256, 64) / 16)


def _module(fn, args) -> bytes:
    return lower_to_stablehlo(make_fx(fn)(*args), isolate=False).module


def _ynn_fusions_with_a_reduce(loaded) -> int:
    """How many of the compiled program's YNNPACK fusions hold a reduce."""
    text = loaded.hlo_modules()[0].to_string()
    bodies = dict(re.findall(r"^(%\S+) \(.*?\{\n(.*?)^\}", text, re.S | re.M))
    called = re.findall(r'calls=(%[\w.]+), backend_config=\{[^\n]*"__ynn_fusion"', text)
    return sum(" reduce(" in bodies[name] for name in called)


def test_a_short_reduction_is_found_and_a_long_one_is_not():
    assert ynn_reductions.short_reduction(_module(_pooled_then_projected, _SHORT)) == "reduce over 16 of f32[8,576,4,4]"
    assert ynn_reductions.short_reduction(_module(_normalised_rows, _LONG)) is None


def test_the_module_with_a_short_reduction_keeps_ynnpack_to_dots():
    platform = get_platform("cpu")
    module = _module(_pooled_then_projected, _SHORT)
    devices = jaxlib_api.DeviceList((platform.device,))
    default, _ = compile_and_load(platform, module, devices, _compile_options(None, ()), isolate=False)
    assert _ynn_fusions_with_a_reduce(default) >= 1  # what XLA does by default

    loaded, stats = compile_stablehlo(module, platform, None, choose_schedule=False)
    assert stats.ynn_reductions_off == "reduce over 16 of f32[8,576,4,4]"
    assert _ynn_fusions_with_a_reduce(loaded) == 0


def test_the_override_names_what_the_default_keeps_but_reductions():
    """The override lists YNNPACK's fusion types itself: with reductions added
    back it must compile to exactly the default's program, or jaxlib's defaults
    changed and ynn_reductions.DOTS_ONLY needs another look."""
    platform = get_platform("cpu")
    devices = jaxlib_api.DeviceList((platform.device,))
    for fn, args in ((_pooled_then_projected, _SHORT), (_normalised_rows, _LONG)):
        module = _module(fn, args)
        default = _compile_options(None, ())
        with_reductions = _compile_options(None, ())
        with_reductions.env_option_overrides = [
            (ynn_reductions.USER_FLAG, f"LIBRARY_FUSION_TYPE_REDUCE,{ynn_reductions.DOTS_ONLY[1]}")
        ]
        texts = [
            re.sub(r"\.\d+", "", compile_and_load(platform, module, devices, options, isolate=False)[0].hlo_modules()[0].to_string())
            for options in (default, with_reductions)
        ]
        assert texts[0] == texts[1]


def test_the_island_reports_it_and_matches_eager():
    model = torch.nn.Sequential(torch.nn.Conv2d(576, 576, 1), torch.nn.Hardswish())

    def excite(x):
        pooled = model(x).mean(dim=(2, 3), keepdim=True)
        return x * torch.sigmoid(pooled)

    x = torch.randn(8, 576, 4, 4)
    with torch.no_grad():
        got = torch.compile(excite, backend="tpu", options={"cache": False, "strict": True})(x)
        torch.testing.assert_close(got, excite(x), rtol=1e-5, atol=1e-5)
    (island,) = report.current().islands()
    assert island.compile_source == "xla"
    assert island.ynn_reductions_off is not None and island.ynn_reductions_off.startswith("reduce over 16 of")


def test_fusion_types_named_in_xla_flags_stand():
    platform = get_platform("cpu")
    assert not ynn_reductions.applies(platform, "--xla_cpu_experimental_ynn_fusion_type=individual_dot")
    assert ynn_reductions.applies(platform, "--xla_cpu_enable_fast_math=false")
