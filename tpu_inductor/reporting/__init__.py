"""Views of the backend's record (:mod:`tpu_inductor.report`).

Why a package apart from the record: every compile stage writes into
``tpu_inductor.report`` and must import it cheaply, while the views (JSON and
its schema, the text summary, the HTML page, the report directory,
reproducer bundles, PyTorch's structured trace, ``explain``) are read rarely
and import more. Nothing here runs at import time.

- :mod:`.serialize`: ``Report`` <-> stable JSON, versioned, with ``report_schema.json``
- :mod:`.summary`: ``str(report)``, and the tables the HTML page shares
- :mod:`.html`: one self-contained page (inline CSS and SVG, no scripts or links)
- :mod:`.files`: the per-process report directory (``report_dir`` option)
- :mod:`.repro`: reproducer bundles for failed lowerings and XLA compiles
- :mod:`.trace`: TORCH_LOGS registration and ``TORCH_TRACE`` artifacts
- :mod:`.explain`: :func:`tpu_inductor.explain`
"""
