"""What this process keeps between compiles: one object, one ``reset()``.

Why: a few things outlive a ``torch.compile`` region on purpose: what was
learned per cache directory (the support table, kernel timings, the traced
graphs' index), executables already loaded, parameters kept resident on a
device, cache directories found unwritable. Each was a dict in the module
that fills it, and tests reset them one by one. Here they are the fields of
:data:`STATE`, filled by those modules; :meth:`ProcessState.reset` empties
them all. PJRT clients, the lowering helper process and report directories
being written stay: they belong to the process, not to what it compiled.

Imports nothing heavy: the CLI reads the cache module, which uses it.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ProcessState:
    support_tables: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """Cache directory -> the support table learned there (compiled_graph.py)."""
    kernel_choosers: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """(platform, device kind, cache directory) -> its kernel chooser (placement/kernel_choice.py)."""
    traced_indexes: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """Cache directory -> what each Dynamo graph was traced with (aot_cache.py)."""
    executables: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Executable key -> loaded PJRT executable (runtime/executable.py)."""
    schedule_choices: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Chosen-schedule executable key -> its choice, made or to be made (runtime/executable.py)."""
    resident_buffers: dict[Any, Any] = dataclasses.field(default_factory=dict)
    """(platform, device id) -> tensors kept on that device (runtime/transfer.py)."""
    unwritable_dirs: dict[str, str] = dataclasses.field(default_factory=dict)
    """Cache directory -> why writing it failed (runtime/disk_cache.py)."""

    def reset(self) -> None:
        """Forget everything above, as a new process would (disk is untouched)."""
        for field in dataclasses.fields(self):
            getattr(self, field.name).clear()


STATE = ProcessState()
