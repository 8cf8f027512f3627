"""Facts about an ATen graph, computed and returned, never rewriting it.

Which symbolic dims may be padded (padding_safety.py and its rules), the
real sizes a padded graph reads (real_lengths.py), the nodes computed from
parameters alone (frozen_parameters.py), graphs that only update their
inputs in place (in_place_updates.py), and ``topk`` calls whose result
depends on PyTorch's tie order (tie_sensitive_ops.py). Passes and
placement read these facts; nothing here changes a graph.
"""
