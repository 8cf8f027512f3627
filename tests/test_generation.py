"""LLM generation under backend="tpu": every decode step on the device, a bounded
number of compiles, eager's tokens exactly.

The models are benchmarks/generate.py's tiny random-weight configs (no
download). Greedy tokens must be equal, not close: one different argmax
changes every later token. ``eager_calls`` of a dynamic graph counts the
calls that ran in eager PyTorch (past the recompile budget, or a bucket XLA
refused); the bars are the issue's: zero after the first generate call, and
compiles bounded by the buckets rather than by the number of tokens.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import tpu_inductor.report as report
from benchmarks.generate import Generator, prompt
from benchmarks.generate_steps import EagerSteps

NEW_TOKENS = 12


@pytest.fixture(autouse=True)
def fresh_cache_dir(tmp_path, monkeypatch):
    # Read through the environment: CompileConfig passes torch.compile a mode, which excludes options.
    monkeypatch.setenv("TPU_INDUCTOR_CACHE_DIR", str(tmp_path))


def _generate_and_check(arch: str, mode: str, calls: list[tuple[int, int]]) -> None:
    gave_up = report.dynamo_recompile_limit_hits()
    eager = Generator(arch, mode, None)
    expected = [eager(*prompt(length, batch), NEW_TOKENS) for length, batch in calls]
    tpu = Generator(arch, mode, "tpu")
    steps = EagerSteps(tpu)
    for index, ((length, batch), want) in enumerate(zip(calls, expected)):
        before = sum(d.eager_calls for d in report.current().dynamic_graphs)
        got = tpu(*prompt(length, batch), NEW_TOKENS)
        assert torch.equal(got, want), (length, batch)
        after = sum(d.eager_calls for d in report.current().dynamic_graphs)
        if index:
            assert after == before, f"decode steps ran in eager at prompt {length}, batch {batch}"
    assert report.current().fallbacks() == []
    assert report.dynamo_recompile_limit_hits() == gave_up  # Dynamo's recompile limit would run frames in eager
    assert (steps.prefill, steps.decode) == (0, 0)
    dynamic = report.current().dynamic_graphs
    # The cache and prompt lengths are bucketed; no size compiles exactly.
    assert any(d.padded for d in dynamic) and not [d.exact for d in dynamic if d.exact]
    # Steps on the device: a dynamic graph's calls of its executables, and the
    # calls of a static one (a decode step whose only symbol is a number, such as
    # a sliding-window cache's token count: dynamic/scalar_symbols.py).
    static = [g for g in report.current().graphs if g.graph_id not in {d.graph_id for d in dynamic}]
    on_device = sum(d.device_calls for d in dynamic) + sum(g.executions for g in static)
    assert on_device >= len(calls) * (NEW_TOKENS - 2)
    assert "Dynamic graphs (calls on the device / in eager" in str(report.current())
    compiled = [r for r in report.current().recompiles if r.outcome == "compiled"]
    # Powers of two: at most three decode buckets and two prefill buckets here.
    assert len(compiled) <= 8, [r.bucket for r in compiled]


def test_generate_with_the_default_dynamic_cache_stays_on_the_device():
    _generate_and_check("llama", "dynamic", [(7, 1), (12, 1), (20, 1)])


def test_a_new_prompt_length_inside_a_bucket_compiles_nothing():
    """Prompts 12 and 15 share the prefill bucket 16, and their decode steps
    the cache buckets 16 and 32: the second generate call compiles nothing."""
    tpu = Generator("llama", "dynamic", "tpu")
    tpu(*prompt(7), NEW_TOKENS)  # Dynamo's first, static traces
    tpu(*prompt(12), NEW_TOKENS)
    compiles = report.compile_counts()["xla_compiles"]
    recompiles = len(report.current().recompiles)
    tpu(*prompt(15), NEW_TOKENS)
    assert report.compile_counts()["xla_compiles"] == compiles
    assert len(report.current().recompiles) == recompiles


@torch._dynamo.config.patch(recompile_limit=1)
def test_each_call_dynamo_runs_in_eager_past_its_recompile_limit_is_counted():
    """Past ``recompile_limit`` Dynamo runs every call that no cached trace
    accepts in eager, and counts only the first (``dynamo_recompile_limit_hits``); the
    benchmark counts each. Gemma 3 with a static cache needs 9 traces for
    generate.py's 8 calls and ran 3 prefills in eager where it reported 1.
    Here a limit of 1 leaves the prefill traced and every decode step, and
    the second call's prefill, in eager; the benchmark tells the two apart."""
    gave_up = report.dynamo_recompile_limit_hits()
    eager = Generator("llama", "static", None)
    tpu = Generator("llama", "static", "tpu")
    steps = EagerSteps(tpu)
    for calls, length in enumerate((7, 12), 1):
        ids, mask = prompt(length)
        assert torch.equal(tpu(ids, mask, NEW_TOKENS), eager(ids, mask, NEW_TOKENS))
        assert (steps.prefill, steps.decode) == (calls - 1, calls * (NEW_TOKENS - 1))
    assert report.dynamo_recompile_limit_hits() == gave_up + 1
    # The report says so, though none of those calls reached the backend.
    record = report.current()
    assert str(record).count("Dynamo hit its recompile limit (1) 1 time") == 1
    assert record.recompile_limit_hits == 1 and record.to_dict()["summary"]["recompile_limit_hits"] == 1
    [(function, traces)] = record.functions_at_recompile_limit()
    assert "transformers" in function and traces == 1  # the forward, under its decorators


def test_sliding_window_layers_at_batch_two_with_left_padding():
    """Gemma 3's sliding-window cache keeps its last w - 1 keys and offsets the
    mask by a length used as a number; the second row is left-padded."""
    _generate_and_check("gemma3", "dynamic", [(7, 2), (12, 2), (20, 2)])


def test_static_cache_with_sliding_window_layers():
    _generate_and_check("mistral", "static", [(7, 1), (12, 1), (20, 1)])


def test_a_hand_written_greedy_loop_over_forward_and_its_cache():
    """The mask grows a column a step and positions come from its cumsum; the
    second row is left-padded."""
    _generate_and_check("gpt2", "loop", [(7, 2), (12, 2), (20, 2)])


def test_generate_through_transformers_own_compile_config():
    """transformers compiles the decode step itself with ``CompileConfig``,
    whose default ``mode="reduce-overhead"`` our backend once refused
    (``unexpected keyword argument 'mode'``). Greedy tokens equal eager's,
    and no step runs eagerly."""
    eager = Generator("qwen3", "compile_config", None)
    tpu = Generator("qwen3", "compile_config", "tpu")
    for length in (7, 12):
        ids, mask = prompt(length)
        assert torch.equal(tpu(ids, mask, 8), eager(ids, mask, 8))
    assert report.current().graphs and report.current().fallbacks() == []
    assert all(d.eager_calls == 0 for d in report.current().dynamic_graphs)


def test_a_static_cache_crosses_to_the_device_once_per_generate(monkeypatch):
    """On a client that keeps device copies (``zero_copy=False``, a TPU's path),
    each decode step writes its new key/value rows into the cache on the host
    and into its device copy (passes/input_writes_in_place.py,
    runtime/resident_writes.py): the cache is uploaded at most at the prefill and the
    first decode step, not once per token (before, every step uploaded and
    downloaded all of it). The cache is preallocated at one length, as a
    server keeps it, so the decode step is one static graph."""
    from transformers import StaticCache

    from tpu_inductor.runtime import transfer

    monkeypatch.setenv("TPU_INDUCTOR_ZERO_COPY", "0")
    uploads: list[tuple[int, ...]] = []
    upload = transfer.upload
    monkeypatch.setattr(transfer, "upload", lambda t, device: (uploads.append(tuple(t.shape)), upload(t, device))[1])
    models = {backend: Generator("llama", "dynamic", backend).model for backend in (None, "tpu")}

    def generate(model, length: int):
        ids, mask = prompt(length)
        cache = StaticCache(config=model.config, max_cache_len=48)
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)

    layers = models["tpu"].config.num_hidden_layers
    cache_shape = (1, models["tpu"].config.num_key_value_heads, 48, models["tpu"].config.head_dim)
    for length in (7, 12):
        want = generate(models[None], length)
        uploads.clear()
        assert torch.equal(generate(models["tpu"], length), want)
        # At most the keys and values of each layer at the prefill and the first
        # decode step; transformers 5 makes the cache inside the compiled
        # prefill, whose results keep their device buffers: then none at all.
        assert uploads.count(cache_shape) <= 2 * 2 * layers, uploads
    # Each layer's keys and values (their new rows: passes/input_writes_in_place.py)
    # and its token count (a new value the island computes and its call writes:
    # placement/results_into_inputs.py).
    decode = [g for g in report.current().graphs if g.inputs_written_in_place]
    assert decode and all(g.inputs_written_in_place == 3 * layers for g in decode)


def test_a_dynamic_cache_crosses_to_the_device_once_per_bucket(monkeypatch):
    """On a client that keeps device copies (``zero_copy=False``, a TPU's path),
    transformers' default ``DynamicCache`` grows by ``cat`` at every decode step.
    Only each layer's new key and value rows come down; the host builds the grown
    cache, and the device keeps its padded new value for the next step
    (passes/grown_caches.py, dynamic/device_caches.py). The whole cache goes up
    once per bucket it enters, not once per token (before: every token uploaded
    and downloaded all of it)."""
    from tpu_inductor.runtime import transfer

    monkeypatch.setenv("TPU_INDUCTOR_ZERO_COPY", "0")
    moved: list[tuple[str, tuple[int, ...]]] = []
    upload, to_torch = transfer.upload, transfer.to_torch

    def counting_download(buffer, platform):
        result = to_torch(buffer, platform)
        moved.append(("down", tuple(result.shape)))
        return result

    monkeypatch.setattr(transfer, "upload", lambda t, device: (moved.append(("up", tuple(t.shape))), upload(t, device))[1])
    monkeypatch.setattr(transfer, "to_torch", counting_download)
    eager, tpu = Generator("llama", "dynamic", None), Generator("llama", "dynamic", "tpu")
    config = tpu.model.config

    def whole_caches(direction: str) -> list[int]:
        """Lengths of the key/value tensors longer than one position that crossed."""
        return [
            shape[2]
            for way, shape in moved
            if way == direction and len(shape) == 4 and shape[1::2] == (config.num_key_value_heads, config.head_dim)
            and shape[2] > 1
        ]

    ids, mask = prompt(12)
    tpu(ids, mask, NEW_TOKENS)  # compiles: the prefill and a first decode step traced static, then padded
    moved.clear()
    assert torch.equal(tpu(ids, mask, NEW_TOKENS), eager(ids, mask, NEW_TOKENS))
    caches = 2 * config.num_hidden_layers
    # Down: the prefill's cache (its graph is static), then new rows only.
    assert whole_caches("down") == [12] * caches
    # Up: decode steps at cache lengths 12..22 take buckets 16 and 32, each entered once.
    assert whole_caches("up") == [16] * caches + [32] * caches
    decode = [g for g in report.current().graphs if g.caches_kept_on_device]
    assert decode and all(g.caches_kept_on_device == caches for g in decode)
    assert f"{caches} grown caches kept on the device" in str(report.current())
