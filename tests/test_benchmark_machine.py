"""The CPU a benchmark result names (benchmarks/machine.py): XLA's and
oneDNN's kernels differ by instruction set, so a result without it cannot
be told apart from a regression on another machine."""

from __future__ import annotations

from benchmarks.machine import cpu_description

_AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"
_AVX512 = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx2 fma avx512f avx512_vnni amx_tile\n"


def test_names_the_model_and_its_vector_instruction_sets():
    assert cpu_description(_AVX2_ONLY) == "AMD EPYC (avx2, fma; no AVX-512)"
    assert cpu_description(_AVX512) == "Intel Xeon (avx512f, avx512_vnni, amx_tile, avx2, fma)"


def test_an_unreadable_cpuinfo_says_so():
    assert cpu_description("") == "unknown (no AVX; no AVX-512)"
