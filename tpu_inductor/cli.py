"""The ``tpu-inductor`` command line.

Why: the cache directory outlives processes, so users need a way to see what
is in it and to shrink or empty it without knowing its layout; ``report``
runs a script and shows what the backend did with it (the answer to "why is
my model slow / recompiling / not on the device?"); ``doctor`` says what this
machine has (PJRT platforms and devices, versions, where the cache is), the
first thing to paste into a bug report. Each top-level command is one
``_add_*`` function that adds its subparser and sets ``handler``; add a new
command by writing one and listing it in ``COMMANDS``.

Starting the CLI imports neither torch nor jaxlib; a command that needs them
imports them itself.

The CLI reads settings through :class:`~tpu_inductor.config.Config` like the
backend does, so ``TPU_INDUCTOR_CACHE_DIR`` points both at the same place.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from tpu_inductor.config import Config, parse_size
from tpu_inductor.errors import ConfigError
from tpu_inductor.runtime import torch_cache
from tpu_inductor.runtime.disk_cache import KINDS, CacheDir
from tpu_inductor.versions import COMPONENTS, installed


def _format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"  # pragma: no cover


def _config(args: argparse.Namespace) -> Config:
    return Config.load({"cache_dir": args.cache_dir} if args.cache_dir else {})


def _open_cache(args: argparse.Namespace) -> CacheDir:
    return CacheDir.of(_config(args))


def _cache_info(args: argparse.Namespace) -> int:
    config = _config(args)
    cache = CacheDir.of(config)
    entries = cache.entries(remove_stale=False)  # info only looks
    by_kind = {kind: [e for e in entries if e.kind == kind] for kind in KINDS}
    traced = torch_cache.traced_entries()
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
        "learned_unsupported": cache.learned_unsupported(),
        "traced_location": str(torch_cache.torch_cache_dir() / "aotautograd"),
        "traced": len(traced),
        "traced_bytes": sum(p.stat().st_size for p in traced),
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
    print(
        f"traced:      {info['traced']} Dynamo graph -> ATen graphs ({_format_size(info['traced_bytes'])}) "
        f"in PyTorch's AOTAutograd cache, {info['traced_location']}"
    )
    print(f"hits:        {info['hits']} (since each entry was created)")
    print(f"saves:       {info['saves_seconds']:.2f} s of lowering and compiling when each entry is used once")
    if info["unreadable"] or info["incomplete_writes"]:
        print(
            f"damaged:     {info['unreadable']} unreadable entries, {info['incomplete_writes']} "
            "temporary directories of writes in progress or interrupted (prune removes them)"
        )
    learned = info["learned_unsupported"]
    confirmed = sum(bool(e.get("confirmed")) for e in learned)
    print(f"learned:     {len(learned)} op call(s) that failed to lower alone ({confirmed} confirmed by a second process)")
    for entry in learned:
        state = "confirmed" if entry.get("confirmed") else "re-probed by the next process"
        print(f"  {entry['signature']}: {entry.get('reason')} [{state}]")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    learned = cache.side_files()
    removed = cache.clear()
    repros = cache.clear_repros()
    traced = torch_cache.clear_traced_entries()
    print(f"removed {removed} entries from {cache.root}" + (
        f" and {len(learned)} learned file(s) (unsupported ops, kernel timings)" if learned else ""
    ) + (f" and {repros} reproducer bundle(s)" if repros else "") + (
        f", and {traced} traced graph(s) from PyTorch's AOTAutograd cache" if traced else ""
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


def _report(args: argparse.Namespace) -> int:
    """Run a script as ``__main__`` with the report directory set, then show the report."""
    import runpy
    import traceback

    from tpu_inductor import report
    from tpu_inductor.reporting import files

    script = Path(args.script)
    if not script.is_file():
        print(f"tpu-inductor report: no such script: {script}", file=sys.stderr)
        return 2
    root = Path(args.report_dir).resolve()
    # The backend reads its settings through Config, from the environment too.
    os.environ["TPU_INDUCTOR_REPORT_DIR"] = str(root)
    directory = files.directory_for(root)
    print(f"tpu-inductor: writing the report to {directory.path}", file=sys.stderr)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.resolve().parent))
    status = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the report of a failing run is the one most wanted
        traceback.print_exc()
        status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    directory.flush()
    if args.json:
        print(report.current().to_json())
    else:
        print(report.current())
    print(f"\nreport: {directory.html_path}\njson:   {directory.json_path}")
    return status


def _add_report(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report",
        help="run a script with the tpu backend and report graph breaks, fallbacks, recompiles, compile time",
        description="Runs SCRIPT as __main__ (its torch.compile(..., backend='tpu') calls are "
        "recorded) and writes report.json, report.html and each island's StableHLO under "
        "REPORT_DIR/tpu_inductor-<time>-<pid>/.",
    )
    parser.add_argument(
        "--report-dir",
        default="tpu_inductor_reports",
        help="where reports go (default: ./tpu_inductor_reports)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the summary")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    parser.set_defaults(handler=_report)


def _startup_notes() -> list[str]:
    """What makes every process that starts the backend slower than it need be."""
    ml_dtypes = installed("ml_dtypes")
    if ml_dtypes and tuple(int(p) for p in ml_dtypes.split(".")[:2] if p.isdigit()) >= (0, 7):
        return [f"ml_dtypes {ml_dtypes} takes 0.4-0.6 s to import (jax imports it in every process); "
                "pip install 'ml_dtypes<0.7' (0.6.0: 5 ms)"]
    return []


def _doctor(args: argparse.Namespace) -> int:
    """What this machine offers the backend; each probe reports instead of failing."""
    import platform as host

    info: dict = {"python": sys.version.split()[0], "machine": f"{host.system()} {host.machine()}"}
    versions = {dist: installed(dist) for dist in COMPONENTS}
    info["versions"] = versions
    info["notes"] = _startup_notes()

    config = _config(args)
    cache = CacheDir.of(config)
    entries = cache.entries(remove_stale=False) if Path(cache.root).exists() else []
    info["cache"] = {
        "location": str(cache.root),
        "enabled": config.cache,
        "exists": Path(cache.root).exists(),
        "entries": len(entries),
        "bytes": sum(e.bytes for e in entries),
    }
    info["report_dir"] = config.report_dir

    from tpu_inductor.errors import PlatformUnavailableError

    from tpu_inductor.runtime.platform import INSTALL_HINT, PLUGINS

    platforms = {}
    for name in ("cpu", "cuda", "tpu"):
        plugin = next(((dist, v) for dist in PLUGINS[name] if (v := installed(dist))), None)
        if plugin is None:
            platforms[name] = {"available": False, "why": "plugin not installed", "install": INSTALL_HINT[name]}
            continue
        try:
            from tpu_inductor.runtime.platform import get_platform

            chosen = get_platform(name)
            platforms[name] = {
                "available": True,
                "plugin": f"{plugin[0]} {plugin[1]}",
                "version": chosen.version,
                "devices": [f"{d.device_kind} (id {d.id})" for d in chosen.client.local_devices()],
            }
        except (PlatformUnavailableError, Exception) as exc:  # a broken plugin is a finding
            platforms[name] = {"available": False, "plugin": f"{plugin[0]} {plugin[1]}",
                               "why": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    info["platforms"] = platforms
    try:
        from tpu_inductor.runtime.platform import select_platform

        info["default_platform"] = config.platform or select_platform(None, ())
    except Exception as exc:  # pragma: no cover - reported, not raised
        info["default_platform"] = f"unknown ({exc})"

    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"python:       {info['python']} on {info['machine']}")
    print("versions:     " + ", ".join(f"{k} {v or 'absent'}" for k, v in versions.items()))
    for name, found in platforms.items():
        if found["available"]:
            print(f"platform {name:4} available ({found['plugin']}, {found['version']}); "
                  f"devices: {', '.join(found['devices'])}")
        elif "install" in found:
            print(f"platform {name:4} unavailable: {found['why']}; to use it: {found['install']}")
        else:
            print(f"platform {name:4} unavailable ({found['plugin']}): {found['why']}")
    print(f"default:      {info['default_platform']}")
    for note in info["notes"]:
        print(f"note:         {note}")
    cache_info = info["cache"]
    print(
        f"cache:        {cache_info['location']} ({'on' if cache_info['enabled'] else 'off'}; "
        f"{cache_info['entries']} entries, {_format_size(cache_info['bytes'])})"
    )
    print(f"report dir:   {info['report_dir'] or 'not set (TPU_INDUCTOR_REPORT_DIR)'}")
    return 0


def _add_doctor(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "doctor", help="PJRT platforms and devices, versions of torch/torch-mlir/jaxlib/libtpu, cache location"
    )
    parser.add_argument("--cache-dir", help="cache directory (default: as the backend resolves it)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_doctor)


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
        "clear", parents=[common], help="remove every entry (ours in PyTorch's AOTAutograd cache too) and the learned files"
    )
    clear.set_defaults(handler=_cache_clear)
    prune = actions.add_parser(
        "prune", parents=[common], help="evict least-recently-used entries down to a size"
    )
    prune.add_argument(
        "--max-size", type=_size_argument, required=True, help="bytes, or a size like 500M or 2G"
    )
    prune.set_defaults(handler=_cache_prune)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_cache, _add_report, _add_doctor]


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
