"""Text generation under backend="tpu": compiles, eager steps, tokens, latency.

Tiny random-weight configs of Llama, GPT-2, Gemma 3, Qwen 3 and Mistral
(Gemma 3 and Mistral with sliding-window layers), and of the encoder-decoders
T5 and BART, built from configs with no download. For each architecture and
way of generating:

* ``dynamic``: ``generate()`` with transformers' default ``DynamicCache``
  (``model.forward`` compiled);
* ``symbolic``: the same with ``torch.compile(..., dynamic=True)``: Dynamo
  traces every size symbolically from the first call, no static trace first
  (fewer traces: what the report advises past Dynamo's recompile limit);
* ``static``: ``generate(cache_implementation="static")``;
* ``compile_config``: transformers compiles the decode step itself
  (``CompileConfig(backend=...)``, static cache);
* ``loop``: a hand-written greedy loop over ``forward`` with its cache,
  the mask grown a column a step and positions from its ``cumsum``.

The encoder-decoders run ``dynamic``, ``symbolic`` and ``static`` (the other
two are written for decoder-only models).

one worker process runs four ``generate`` calls with prompt lengths 7, 12,
15 and 20 and 32 new tokens each, at batch 1 and at batch 2 with left
padding, and records: tokens equal to eager's (greedy, exact), XLA compiles
for all eight calls, steps that ran in eager PyTorch after the first call
(dynamic graphs' eager calls, nodes placed in eager, and ``forward`` calls
Dynamo ran in eager past its recompile limit), all and decode steps alone
(a ``generate`` call's first ``forward`` is its prefill), and the first
call's wall time (compiles included), and the bytes that cross between torch
and the device per decode token on ``zero_copy=False`` (a TPU's path) beside
the whole cache's size (``transfers``: a counted, noise-free check that the
cache is updated on the device side). With ``--timing``, steady-state
prefill latency and per-token decode latency (and tokens/s) for eager,
Inductor and tpu, each path in a process of its own, medians of paired
rounds, the paths' order rotating each round (prompt 12; decode = (T(33
tokens) - T(1 token)) / 32, prefill = T(1 token), medians of 8 of each per
round), and Inductor's first call and Dynamo graph count.

Nothing is pinned (threads, allocator, XLA flags): these are the numbers at
the settings users run. The load average is recorded at start and end.

``--device cuda`` runs the models and prompts on a GPU (the tpu backend then
picks jax's CUDA client); results go to ``--out`` (default: the CPU table's
JSON for the CPU run, ``generate-cuda.json`` for a GPU run).

``--size medium`` builds the same architectures at ~50M parameters (hidden
512, 8 layers, a 32,000-token vocabulary): there reading the weights, not
the per-call costs, decides the decode time. Its results go to
``generate-medium.json`` and the page's second table.

Run: python benchmarks/generate.py [--timing] [--only llama:dynamic] [--write-docs] [--device cuda] [--size medium]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.generate_steps import EagerSteps, eager_steps  # noqa: E402
from benchmarks.generate_table import table, transfer_cell  # noqa: E402
from tpu_inductor.report import dynamo_recompile_limit_hits  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "generate.json"
CUDA_RESULTS = ROOT / "benchmarks" / "results" / "generate-cuda.json"
MEDIUM_RESULTS = ROOT / "benchmarks" / "results" / "generate-medium.json"
RESULTS_PAGE = ROOT / "docs" / "generation.md"
CPU_OUTPUTS = {
    "tiny": (RESULTS, ("<!-- generate-table:start -->", "<!-- generate-table:end -->")),
    "medium": (MEDIUM_RESULTS, ("<!-- generate-medium-table:start -->", "<!-- generate-medium-table:end -->")),
}
"""Size (``--size``) -> a CPU run's results JSON and the markers of its table in :data:`RESULTS_PAGE`."""

DECODER_ONLY = ("llama", "gpt2", "gemma3", "qwen3", "mistral")
ENCODER_DECODERS = ("t5", "bart")
ARCHITECTURES = DECODER_ONLY + ENCODER_DECODERS
MODES = ("dynamic", "symbolic", "static", "compile_config", "loop")
PROMPT_LENGTHS = (7, 12, 15, 20)
NEW_TOKENS = 32
VOCAB = 128
DEVICE = "cpu"
"""Where models and prompts live (``--device``); set once by :func:`main`."""


SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=VOCAB, window=8),
    "medium": dict(hidden=512, intermediate=1376, layers=8, heads=8, kv_heads=4, head_dim=64, vocab=32000, window=32),
}
"""Model sizes (``--size``). ``tiny`` (the table and the bars): the per-call
costs around the layers dominate. ``medium`` (~50M parameters, a 32,000-token
vocabulary): reading the weights dominates, as in the models users run."""
SIZE = "tiny"
"""Which of :data:`SIZES` (``--size``); set once by :func:`main`."""


def modes_of(arch: str) -> tuple[str, ...]:
    """The ways of generating :func:`main` runs for ``arch`` by default."""
    return ("dynamic", "symbolic", "static") if arch in ENCODER_DECODERS else MODES


def all_rows() -> list[tuple[str, str]]:
    """Every (architecture, mode) row :func:`main` runs by default, in the table's order."""
    return [(arch, mode) for arch in ARCHITECTURES for mode in modes_of(arch)]


def build_model(arch: str):
    """A random-weight causal LM, or encoder-decoder, of :data:`SIZE` (seeded:
    the same weights every time)."""
    import torch
    import transformers as tf

    size = SIZES[SIZE]
    small = dict(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
        max_position_embeddings=256,
    )
    configs: dict[str, Callable[[], Any]] = {
        "llama": lambda: tf.LlamaConfig(**small),
        "gpt2": lambda: tf.GPT2Config(vocab_size=size["vocab"], n_embd=size["hidden"], n_layer=size["layers"],
                                      n_head=size["heads"], n_positions=256, bos_token_id=0, eos_token_id=0),
        "gemma3": lambda: tf.Gemma3TextConfig(**small, head_dim=size["head_dim"], sliding_window=size["window"],
                                              layer_types=["sliding_attention", "full_attention"] * (size["layers"] // 2)),
        "qwen3": lambda: tf.Qwen3Config(**small, head_dim=size["head_dim"]),
        "mistral": lambda: tf.MistralConfig(**small, sliding_window=size["window"]),
        # Token 0 pads the prompts (prompt()); T5 starts the decoder with it too.
        # Their default initialisations make the tiny models repeat one token:
        # wider ones make a comparison of tokens mean something.
        "t5": lambda: tf.T5Config(vocab_size=size["vocab"], d_model=size["hidden"], d_kv=size["head_dim"],
                                  d_ff=size["intermediate"], num_layers=size["layers"], num_heads=size["heads"],
                                  pad_token_id=0, decoder_start_token_id=0, eos_token_id=1, initializer_factor=10.0),
        "bart": lambda: tf.BartConfig(vocab_size=size["vocab"], d_model=size["hidden"],
                                      encoder_layers=size["layers"], decoder_layers=size["layers"],
                                      encoder_attention_heads=size["heads"], decoder_attention_heads=size["heads"],
                                      encoder_ffn_dim=size["intermediate"], decoder_ffn_dim=size["intermediate"],
                                      max_position_embeddings=256, pad_token_id=0, init_std=1.0),
    }
    torch.manual_seed(0)
    auto = tf.AutoModelForSeq2SeqLM if arch in ENCODER_DECODERS else tf.AutoModelForCausalLM
    return auto.from_config(configs[arch]()).eval().to(DEVICE)


def prompt(length: int, batch: int = 1):
    """``(input_ids, attention_mask)``; at batch > 1 the last row is left-padded
    by a third of its length (token 0 is the pad token)."""
    import torch

    ids = torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[-1, : length // 3] = 0
        ids[-1, : length // 3] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


def synchronize() -> None:
    """Wait for the device (a timed call ends when its work is done)."""
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def greedy_loop(forward: Callable, ids, mask, new_tokens: int):
    """Greedy decoding over ``forward`` and its cache, as a user writes it:
    the mask grows by one column a step, positions count the real tokens."""
    import torch
    from transformers import DynamicCache

    def positions(mask):
        return (mask.cumsum(-1) - 1).clamp(min=0)

    out = forward(input_ids=ids, attention_mask=mask, position_ids=positions(mask), cache=DynamicCache(), use_cache=True)
    tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        out = forward(input_ids=tokens[-1], attention_mask=mask, position_ids=positions(mask)[:, -1:],
                      cache=out.cache, use_cache=True)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([ids, *tokens], 1)


class Generator:
    """One way of generating (``mode``) with one backend (None = eager)."""

    def __init__(self, arch: str, mode: str, backend: Optional[str]) -> None:
        import torch

        self.model = build_model(arch)
        self.mode = mode
        self.backend = backend
        self.forward = self.model.forward
        if backend is not None and mode != "compile_config":
            self.forward = torch.compile(self.model.forward, backend=backend, dynamic=True if mode == "symbolic" else None)
            self.model.forward = self.forward
        self.steps: Optional["EagerSteps"] = None  # counts eager work per step, when set
        self.compile_config = None
        if backend is not None and mode == "compile_config":
            from transformers.generation.configuration_utils import CompileConfig

            self.compile_config = CompileConfig(backend=backend)
            self.compile_config._compile_all_devices = True  # transformers compiles CPU models only when asked

    def __call__(self, ids, mask, new_tokens: int = NEW_TOKENS):
        import torch

        if self.steps is not None:
            self.steps.new_call()
        with torch.no_grad():
            if self.mode == "loop":
                return greedy_loop(self.forward, ids, mask, new_tokens)
            kwargs: dict[str, Any] = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                          pad_token_id=0, min_new_tokens=new_tokens)
            if self.mode in ("static", "compile_config"):
                kwargs["cache_implementation"] = "static"
            if self.compile_config is not None:
                kwargs["compile_config"] = self.compile_config
            return self.model.generate(ids, **kwargs)


def correctness(arch: str, mode: str) -> dict:
    """Eight generate calls (four prompt lengths, batch 1 and 2) against eager's tokens."""
    import tpu_inductor.report as report

    calls = [(length, batch) for batch in (1, 2) for length in PROMPT_LENGTHS]
    eager = Generator(arch, mode, None)
    expected = [eager(*prompt(length, batch)) for length, batch in calls]
    report.reset()
    tpu = Generator(arch, mode, "tpu")
    steps = EagerSteps(tpu) if mode != "compile_config" else None
    rows = []
    compiles_batch1 = 0
    for (length, batch), want in zip(calls, expected):
        if batch == 2 and not compiles_batch1:
            compiles_batch1 = report.compile_counts()["xla_compiles"]
        before = eager_steps(report.current(), steps)
        started = time.perf_counter()
        got = tpu(*prompt(length, batch))
        synchronize()
        prefill, decode = (after - first for after, first in zip(eager_steps(report.current(), steps), before))
        rows.append({
            "prompt": length, "batch": batch, "seconds": time.perf_counter() - started,
            "equal": bool(got.shape == want.shape and (got == want).all()),
            "eager_steps": prefill + decode, "eager_decode_steps": decode,
        })
    counts = report.compile_counts()
    return {
        "calls": rows,
        "tokens_equal": all(r["equal"] for r in rows),
        "first_call_seconds": rows[0]["seconds"],
        "eager_steps_after_first": sum(r["eager_steps"] for r in rows[1:]),
        "eager_decode_steps_after_first": sum(r["eager_decode_steps"] for r in rows[1:]),
        "xla_compiles": counts["xla_compiles"],
        "xla_compiles_batch1": compiles_batch1 or counts["xla_compiles"],
        "dynamo_traces": counts["dynamo_traces"],
        "buckets": [
            {"graph": r.graph_id, "bucket": r.bucket, "outcome": r.outcome}
            for r in report.current().recompiles
        ],
    }


TIMING_REPEATS = 8
"""Prefill and generate pairs a path runs per round: ~0.3 s of work, so that
a path's process, idle while the others ran, is warm for most of it."""


def serve_generator(
    arch: str, mode: str, backend: Optional[str], device: str, size: str
) -> tuple[Callable[[str], Any], dict]:
    """In a path's own process (``paired_rounds.PathWorker``): a generator
    for ``backend`` (None: eager), warmed up at prompt 12. Its handler answers
    ``"round"`` with that round's prefill and per-token decode seconds, and
    ``"eager_frames"`` with the ``forward`` calls Dynamo ran in eager since."""
    import torch._dynamo.utils

    global DEVICE, SIZE
    DEVICE, SIZE = device, size
    gave_up = dynamo_recompile_limit_hits()
    generate = Generator(arch, mode, backend)
    ids, mask = prompt(12)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    started = time.perf_counter()
    generate(ids, mask, NEW_TOKENS + 1)  # every compile happens here
    synchronize()
    first = {"first_call": time.perf_counter() - started,
             "dynamo_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs}
    # Past the decode step's HOT_CALLS-th call, where tpu starts choosing
    # XLA:CPU's schedule for its executable in the background
    # (runtime/xla_schedule.py): steady state is after the choice is made.
    import tpu_inductor
    from tpu_inductor.runtime.xla_schedule import HOT_CALLS

    for _ in range(math.ceil(HOT_CALLS / NEW_TOKENS) - 1):  # NEW_TOKENS decode steps each
        generate(ids, mask, NEW_TOKENS + 1)
    tpu_inductor.wait_for_background_compiles()
    generate(ids, mask, 1)

    def timed(new_tokens: int) -> float:
        started = time.perf_counter()
        generate(ids, mask, new_tokens)
        synchronize()
        return time.perf_counter() - started

    def handle(message: str) -> Any:
        if message == "eager_frames":
            return dynamo_recompile_limit_hits() - gave_up
        one = [timed(1) for _ in range(TIMING_REPEATS)]
        many = [timed(NEW_TOKENS + 1) for _ in range(TIMING_REPEATS)]
        return {"prefill": statistics.median(one), "decode": (statistics.median(many) - statistics.median(one)) / NEW_TOKENS}

    return handle, first


def timing(arch: str, mode: str, rounds: int) -> dict:
    """Steady-state prefill and per-token decode latency, eager / Inductor / tpu,
    each in a process of its own (a user runs one backend in a process: paths
    sharing one slowed each other), warmed up first, medians of paired rounds
    with the paths' order rotated each round."""
    from benchmarks.paired_rounds import path_workers, rotated

    backends = {"eager": None, "inductor": "inductor", "tpu": "tpu"}
    setups = {name: (serve_generator, arch, mode, backend, DEVICE, SIZE) for name, backend in backends.items()}
    with path_workers(setups) as workers:
        samples: dict[str, dict[str, list[float]]] = {n: {"prefill": [], "decode": []} for n in workers}
        for round_index in range(rounds):
            for name in rotated(list(workers), round_index):
                for key, seconds in workers[name].ask("round").items():
                    samples[name][key].append(seconds)
        ran_in_eager = {name: workers[name].ask("eager_frames") for name in ("inductor", "tpu")}
        first = {name: worker.info for name, worker in workers.items()}
    if any(ran_in_eager.values()) or not all(first[n]["dynamo_graphs"] for n in ("inductor", "tpu")):
        raise RuntimeError(f"a compiled backend ran in eager: {first}, forward calls in eager {ran_in_eager}")
    medians = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    for name in medians:
        medians[name]["tokens_per_second"] = 1.0 / medians[name]["decode"]
        medians[name].update(first[name])
    return medians


def transfers(arch: str, mode: str) -> dict:
    """Bytes that cross between torch and the device per decode token on a
    client that keeps device copies (``zero_copy=False``: the path a TPU
    takes), beside the size of the whole KV cache: a cache updated on the
    device side moves its new rows, not itself (issue 20's bar). Prompt 12,
    batch 1; per token = (bytes for 33 tokens - bytes for 1 token) / 32."""
    import torch

    from tpu_inductor.runtime import transfer

    moved = {"up": 0, "down": 0}
    upload, to_torch = transfer.upload, transfer.to_torch

    def counting_upload(tensor, device):
        moved["up"] += tensor.numel() * tensor.element_size()
        return upload(tensor, device)

    def counting_download(buffer, platform):
        result = to_torch(buffer, platform)
        moved["down"] += result.numel() * result.element_size()
        return result

    os.environ["TPU_INDUCTOR_ZERO_COPY"] = "0"
    transfer.upload, transfer.to_torch = counting_upload, counting_download
    try:
        torch._dynamo.reset()
        generate = Generator(arch, mode, "tpu")
        ids, mask = prompt(12)
        generate(ids, mask, NEW_TOKENS + 1)  # every compile happens here
        generate(ids, mask, 1)
        counts = []
        for tokens in (1, NEW_TOKENS + 1):
            moved.update(up=0, down=0)
            generate(ids, mask, tokens)
            counts.append(dict(moved))
    finally:
        transfer.upload, transfer.to_torch = upload, to_torch
        del os.environ["TPU_INDUCTOR_ZERO_COPY"]
    config = generate.model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    cache = 2 * text.num_hidden_layers * heads * head_dim * (12 + NEW_TOKENS + 1) * 4
    return {
        "up_per_token": (counts[1]["up"] - counts[0]["up"]) / NEW_TOKENS,
        "down_per_token": (counts[1]["down"] - counts[0]["down"]) / NEW_TOKENS,
        "cache_bytes": cache,
    }


def child(arch: str, mode: str, with_timing: bool, rounds: int, transfers_only: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="generate-cache-") as cache_dir:
        # Fresh cache directories (read through the environment: transformers'
        # CompileConfig passes torch.compile a mode, which excludes options):
        # ours, and PyTorch's, where AOTAutograd keeps our traced graphs and
        # Inductor its kernels, so that both first calls are cold. The path
        # workers of --timing inherit both.
        os.environ["TPU_INDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "tpu")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "torch")
        if transfers_only:
            print("RESULT " + json.dumps({"arch": arch, "mode": mode, "transfers": transfers(arch, mode)}))
            return
        result = {"arch": arch, "mode": mode, **correctness(arch, mode)}
        # transformers compiles compile_config's step with its own options; the
        # cache size below is a decoder-only model's.
        if DEVICE == "cpu" and mode != "compile_config" and arch in DECODER_ONLY:
            result["transfers"] = transfers(arch, mode)
        if with_timing:
            result["timing"] = timing(arch, mode, rounds)
    print("RESULT " + json.dumps(result))


def run_row(arch: str, mode: str, with_timing: bool, rounds: int, timeout: int, transfers_only: bool = False) -> dict:
    """One fresh worker process per row, so a crash or hang counts as that row's."""
    command = [sys.executable, __file__, "--child", f"{arch}:{mode}", "--rounds", str(rounds), "--device", DEVICE,
               "--size", SIZE]
    if with_timing:
        command.append("--timing")
    if transfers_only:
        command.append("--transfers-only")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"arch": arch, "mode": mode, "error": f"timed out after {timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"arch": arch, "mode": mode, "error": f"exit {done.returncode}: " + " | ".join(tail)}


def _redo_transfers(args: argparse.Namespace, wanted: list[tuple[str, str]], out: Path) -> int:
    """``--transfers-only``: each named row's transfers measured again in a
    worker of its own, the rest of the row kept; the run is noted in the meta."""
    from benchmarks.sweep_common import environment, write_json

    results = json.loads(out.read_text())
    rows = {(r["arch"], r["mode"]): r for r in results["rows"]}
    missing = [f"{arch}:{mode}" for arch, mode in wanted if (arch, mode) not in rows]
    if missing:
        print(f"{out.name} has no row {', '.join(missing)}: run those rows in full first")
        return 1
    redone = []
    for arch, mode in wanted:
        item = f"{arch}:{mode}"
        measured = run_row(arch, mode, False, args.rounds, args.timeout, transfers_only=True)
        if "error" in measured:
            print(f"{item}: {measured['error']}")
            return 1
        rows[(arch, mode)]["transfers"] = measured["transfers"]
        redone.append(item)
        print(f"{item}: {transfer_cell(measured['transfers'])}", flush=True)
    environment_now = environment()
    # Each rerun is recorded beside the earlier ones: a row's KB cell is from
    # the last rerun that names it.
    results["meta"].setdefault("transfers_reruns", []).append({
        "date": environment_now["date"],
        "commit": environment_now["tpu_inductor_commit"],
        "dirty": environment_now["tpu_inductor_dirty"],
        "rows": redone,
    })
    write_json(out, results)
    if args.write_docs:
        write_docs(table(results["rows"]))
    return 0


def write_docs(text: str) -> None:
    from benchmarks.sweep_common import replace_between_markers

    replace_between_markers(RESULTS_PAGE, CPU_OUTPUTS[SIZE][1], text)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated arch:mode rows (default: every architecture and mode)")
    parser.add_argument("--timing", action="store_true", help="also time eager / Inductor / tpu (slow: Inductor compiles)")
    parser.add_argument("--timing-modes", default="dynamic,static", help="modes timed with --timing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per row")
    parser.add_argument("--write-docs", action="store_true", help=f"update the table in {RESULTS_PAGE.relative_to(ROOT)}")
    parser.add_argument("--update", action="store_true",
                        help=f"keep the rows of {RESULTS.relative_to(ROOT)} that this run does not redo")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: where models and prompts live")
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES),
                        help=f"model size (default tiny, the table's; medium: results in {MEDIUM_RESULTS.name} and "
                        "the page's second table)")
    parser.add_argument("--out", type=Path, help=f"results JSON (default {RESULTS.relative_to(ROOT)}; "
                        f"{CUDA_RESULTS.name} with --device cuda)")
    parser.add_argument("--transfers-only", action="store_true",
                        help="measure only the KB column (counted bytes, no timing) of the rows named, keeping the "
                        "rest of each row in the results file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global DEVICE, SIZE
    DEVICE, SIZE = args.device, args.size
    if args.write_docs and DEVICE != "cpu":
        parser.error(f"--write-docs writes the CPU table of {RESULTS_PAGE.name}; a GPU run's goes to the README "
                     "through benchmarks/gpu_check.py")
    out = args.out or (CUDA_RESULTS if DEVICE.startswith("cuda") else CPU_OUTPUTS[SIZE][0])
    if args.child:
        arch, mode = args.child.split(":")
        child(arch, mode, args.timing, args.rounds, args.transfers_only)
        return 0
    rows_wanted = (
        [tuple(item.split(":")) for item in args.only.split(",")]
        if args.only
        else all_rows()
    )
    if args.transfers_only:
        return _redo_transfers(args, rows_wanted, out)
    timed = set(args.timing_modes.split(",")) if args.timing else set()
    load_start = os.getloadavg()[0]
    started = time.time()
    rows = []
    for arch, mode in rows_wanted:
        row = run_row(arch, mode, mode in timed, args.rounds, args.timeout)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    from benchmarks.sweep_common import environment, write_json

    meta = {**environment(), "seconds": time.time() - started, "load_average": [load_start, os.getloadavg()[0]],
            "prompt_lengths": PROMPT_LENGTHS, "new_tokens": NEW_TOKENS, "device": DEVICE, "size": SIZES[SIZE]}
    if args.update and out.exists():
        previous = json.loads(out.read_text())
        redone = {(r["arch"], r["mode"]) for r in rows}
        kept = [r for r in previous["rows"] if (r["arch"], r["mode"]) not in redone]
        order = {key: i for i, key in enumerate(all_rows())}
        rows = sorted(kept + rows, key=lambda r: order.get((r["arch"], r["mode"]), len(order)))
        # The kept rows are the earlier run's: its meta stays, and this run is noted as an update of it.
        update = {**meta, "rows": [f"{arch}:{mode}" for arch, mode in sorted(redone)]}
        meta = {**previous["meta"], "updates": [*previous["meta"].get("updates", []), update]}
    write_json(out, {"meta": meta, "rows": rows})
    text = table(rows)
    print("\n" + text)
    print(f"\nload average {meta['load_average'][0]:.2f} -> {meta['load_average'][1]:.2f}; wrote {out}")
    if args.write_docs:
        write_docs(text)
    failed = [r for r in rows if "error" in r or not r["tokens_equal"] or r["eager_steps_after_first"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
