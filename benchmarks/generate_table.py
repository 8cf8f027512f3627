"""The generation benchmark's table (benchmarks/generate.py), from its JSON rows."""

from __future__ import annotations

from typing import Optional


def table(rows: list[dict]) -> str:
    """The Markdown table of generate.py's rows (timing columns where a row was timed)."""
    header = ["architecture", "mode", "tokens = eager", "XLA compiles (4 calls / with batch 2)",
              "steps in eager after call 1: all (decode)", "first call, tpu",
              "KB per decode token up / down, `zero_copy=False` (whole cache)"]
    timed = any("timing" in r for r in rows)
    if timed:
        header += ["decode ms/token (tokens/s), eager / Inductor / tpu", "tpu vs Inductor (decode)",
                   "prefill ms, eager / Inductor / tpu", "first call, Inductor (Dynamo graphs)"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        if "error" in r:
            cells = [r["arch"], r["mode"], f"error: {r['error'][:120]}"] + [""] * (len(header) - 3)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells = [r["arch"], r["mode"], "yes" if r["tokens_equal"] else "NO",
                 f"{r['xla_compiles_batch1']} / {r['xla_compiles']}", eager_steps_cell(r),
                 f"{r['first_call_seconds']:.1f} s", transfer_cell(r.get("transfers"))]
        if timed:
            t = r.get("timing")
            if t is None:
                cells += ["-"] * 4
            else:
                names = ("eager", "inductor", "tpu")
                cells += [
                    " / ".join(f"{t[n]['decode'] * 1e3:.2f} ({t[n]['tokens_per_second']:.0f})" for n in names),
                    f"{t['inductor']['decode'] / t['tpu']['decode']:.2f}x",
                    " / ".join(f"{t[n]['prefill'] * 1e3:.1f}" for n in names),
                    f"{t['inductor']['first_call']:.1f} s ({t['inductor']['dynamo_graphs']})",
                ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def eager_steps_cell(row: dict) -> str:
    """``3 (0)``: steps with eager work after the first call, and of them
    decode steps (rows measured before the split show the first alone)."""
    decode = row.get("eager_decode_steps_after_first")
    return f"{row['eager_steps_after_first']}" + (f" ({decode})" if decode is not None else "")


def transfer_cell(moved: Optional[dict]) -> str:
    if not moved:
        return "-"
    return f"{moved['up_per_token'] / 1e3:.1f} / {moved['down_per_token'] / 1e3:.1f} ({moved['cache_bytes'] / 1e3:.1f})"
