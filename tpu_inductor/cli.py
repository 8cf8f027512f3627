"""The ``tpu-inductor`` command line.

Why: the cache directory outlives processes, so users need a way to see what
is in it and to shrink or empty it without knowing its layout. Each top-level
command (``cache`` today; ``report``, ``doctor`` later) is one ``_add_*``
function that adds its subparser and sets ``handler``; add a new command by
writing one and listing it in ``COMMANDS``.

The CLI reads settings through :class:`~tpu_inductor.config.Config` like the
backend does, so ``TPU_INDUCTOR_CACHE_DIR`` points both at the same place.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from tpu_inductor.config import Config, parse_size
from tpu_inductor.errors import ConfigError
from tpu_inductor.runtime.disk_cache import KINDS, DiskCache


def _format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"  # pragma: no cover


def _open_cache(args: argparse.Namespace) -> DiskCache:
    options = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    config = Config.load(options)
    return DiskCache(config.resolved_cache_dir, config.cache_max_bytes)


def _cache_info(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    entries = cache.entries(remove_stale=False)  # info only looks
    by_kind = {kind: [e for e in entries if e.kind == kind] for kind in KINDS}
    info = {
        "location": str(cache.root),
        "entries": len(entries),
        "graphs": len(by_kind["graphs"]),
        "executables": len(by_kind["executables"]),
        "bytes": sum(e.bytes for e in entries),
        "max_bytes": cache.max_bytes,
        "hits": sum(e.hits for e in entries),
        "saves_seconds": round(sum(e.saves_seconds for e in entries), 3),
        "unreadable": sum(not e.readable for e in entries),
        "incomplete_writes": cache.incomplete_writes(),
    }
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"location:    {info['location']}")
    print(
        f"entries:     {info['entries']} ({info['graphs']} ATen graph -> StableHLO, "
        f"{info['executables']} StableHLO -> executable)"
    )
    print(f"size:        {_format_size(info['bytes'])} of {_format_size(info['max_bytes'])} cap")
    print(f"hits:        {info['hits']} (since each entry was created)")
    print(f"saves:       {info['saves_seconds']:.2f} s of lowering and compiling when each entry is used once")
    if info["unreadable"] or info["incomplete_writes"]:
        print(
            f"damaged:     {info['unreadable']} unreadable entries, {info['incomplete_writes']} "
            "temporary directories of writes in progress or interrupted (prune removes them)"
        )
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    removed = cache.clear()
    learned = list(Path(cache.root).glob("learned_unsupported-*.json"))
    for path in learned:
        path.unlink(missing_ok=True)
    print(f"removed {removed} entries from {cache.root}" + (
        f" and {len(learned)} learned-unsupported-op file(s)" if learned else ""
    ))
    return 0


def _cache_prune(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    evicted = cache.enforce_cap(args.max_size)
    remaining = cache.entries()
    print(
        f"evicted {len(evicted)} least-recently-used entries ({_format_size(sum(e.bytes for e in evicted))}); "
        f"{len(remaining)} entries, {_format_size(sum(e.bytes for e in remaining))} left in {cache.root}"
    )
    return 0


def _size_argument(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_cache(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("cache", help="inspect, prune or clear the compiled-artifact cache")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache-dir",
        help="cache directory (default: TPU_INDUCTOR_CACHE_DIR, else $XDG_CACHE_HOME/tpu_inductor)",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    info = actions.add_parser("info", parents=[common], help="location, entries, size, hits")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(handler=_cache_info)
    clear = actions.add_parser(
        "clear", parents=[common], help="remove every entry (and the learned-unsupported-op files)"
    )
    clear.set_defaults(handler=_cache_clear)
    prune = actions.add_parser(
        "prune", parents=[common], help="evict least-recently-used entries down to a size"
    )
    prune.add_argument(
        "--max-size", type=_size_argument, required=True, help="bytes, or a size like 500M or 2G"
    )
    prune.set_defaults(handler=_cache_prune)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_cache]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-inductor", description="Tools for the tpu_inductor torch.compile backend."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(commands)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:  # a bad TPU_INDUCTOR_* variable: say which, no traceback
        parser.exit(2, f"tpu-inductor: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
