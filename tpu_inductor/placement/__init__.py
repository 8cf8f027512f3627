"""Where each node of an ATen graph runs: on the device or in eager PyTorch, and why.

support.py knows which ops lower (static rules and failures learned on
disk), culprits.py proves which op broke a failed island, kernel_choice.py
times PyTorch's kernels against XLA's, placement.py puts every source
together into the one :class:`~tpu_inductor.placement.placement.Placement`
of a graph, and partition.py groups the device nodes into islands.
"""
