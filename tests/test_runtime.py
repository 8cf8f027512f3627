"""The runtime: zero-copy DLPack on the CPU client, the executable caches."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from tpu_inductor.runtime import get_platform
from tpu_inductor.runtime import transfer


def _round_trip(x: torch.Tensor, platform):
    (buffer,) = transfer.HostViews(platform).buffers((x,))
    return buffer, transfer.host_tensor(buffer)


def test_cpu_tensors_cross_without_copies():
    platform = get_platform("cpu")
    x = torch.randn(64, 64)
    buffer, back = _round_trip(x, platform)
    assert buffer.unsafe_buffer_pointer() == x.data_ptr()
    assert back.data_ptr() == buffer.unsafe_buffer_pointer()
    torch.testing.assert_close(back, x)


def test_parameters_requiring_grad_cross_without_copies():
    platform = get_platform("cpu")
    weight = torch.nn.Parameter(torch.randn(8, 8))
    buffer, _ = _round_trip(weight, platform)
    assert buffer.unsafe_buffer_pointer() == weight.data_ptr()


def test_broadcast_views_are_made_dense_first():
    platform = get_platform("cpu")
    x = torch.randn(1, 5).expand(4, 5)
    torch.testing.assert_close(_round_trip(x, platform)[1], x)


def test_negative_views_upload_as_their_values():
    # numpy() refuses a tensor with the negative bit; DLPack would drop it.
    platform = get_platform("cpu", zero_copy=False)
    negative = torch._neg_view(torch.randn(5))
    torch.testing.assert_close(transfer.to_torch(transfer.to_device(negative, platform), platform), negative)


def _run(script: str, cache_dir: Path) -> str:
    env_script = textwrap.dedent(script)
    out = subprocess.run(
        [sys.executable, "-c", env_script, str(cache_dir)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


WARM_START = """
import sys, torch
import tpu_inductor.report as report
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
x = torch.randn(5, 16)
fn = torch.compile(model, backend="tpu", options={"cache_dir": sys.argv[1]})
with torch.no_grad():
    torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-6)
print(",".join(i.compile_source for i in report.current().islands()))
"""


def test_second_process_loads_executables_from_cache_dir(tmp_path):
    assert _run(WARM_START, tmp_path) == "xla"
    entries = list((tmp_path / "executables").iterdir())
    assert len(entries) == 1
    assert {p.name for p in entries[0].iterdir()} == {"module.mlirbc", "executable.bin", "manifest.json"}
    assert _run(WARM_START, tmp_path) == "disk"


def test_corrupted_entry_is_evicted_and_recompiled(tmp_path):
    _run(WARM_START, tmp_path)
    (entry,) = (tmp_path / "executables").iterdir()
    blob = entry / "executable.bin"
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    assert _run(WARM_START, tmp_path) == "xla"
    assert _run(WARM_START, tmp_path) == "disk"


def test_jaxlib_info_lines_stay_off_the_terminal():
    """A first compile in a fresh process prints nothing of jaxlib's own on stderr."""
    import subprocess
    import sys

    script = "import torch; torch.compile(lambda x: x + 1, backend='tpu', options={'cache': False})(torch.randn(3))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "pjrt_client.cc" not in result.stderr and "PjRt-IFRT" not in result.stderr, result.stderr[-2000:]


def test_an_executable_in_memory_serves_only_the_client_it_was_loaded_on():
    """A process can hold several CPU clients (a mesh's devices are a client
    of their own): the memory level of the executable cache must not hand
    one client's executable to another, whose buffers it cannot take."""
    from tpu_inductor.runtime.executable import compile_stablehlo

    module = """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %y = stablehlo.add %x, %x : tensor<4xf32>
      return %y : tensor<4xf32>
    }
    """
    one, two = get_platform("cpu"), get_platform("cpu", num_devices=2)
    first, _ = compile_stablehlo(module, one, None)
    second, stats = compile_stablehlo(module, two, None)
    assert first.client is one.client
    assert second.client is two.client and stats.source == "xla"
