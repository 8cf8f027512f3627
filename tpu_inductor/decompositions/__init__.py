"""The decomposition table AOTAutograd traces with (table.py), and its parts.

Each other module holds the decompositions of one family of ops that
torch-mlir cannot lower, or lowers to values other than eager's, written
as ATen ops it lowers exactly. ``table.decomposition_table`` is the one
place they are put together.
"""
