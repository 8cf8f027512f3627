"""A model whose report has something to show: run it under ``tpu-inductor report``.

    tpu-inductor report examples/report_demo.py        # then open the report.html it prints

or set ``TPU_INDUCTOR_REPORT_DIR`` and run it directly. The model has the
three things a report exists to find:

- a graph break: a ``print`` and a branch on ``.item()`` (data-dependent
  Python control flow) split the function into several Dynamo graphs;
- a fallback: ``torch.special.i0`` has no StableHLO lowering, so it runs in
  eager PyTorch between two device islands;
- a recompile: the batch size changes, and Dynamo retraces (the report names
  the guard that failed, and the shape that caused it).

Without ``tpu-inductor report`` it prints the summary itself
(``tpu_inductor.explain`` for the first call, the record for the rest).
"""

from __future__ import annotations

import torch

import tpu_inductor


class Demo(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encode = torch.nn.Linear(16, 32)
        self.decode = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encode(x))
        print(f"hidden mean {h.mean():.3f}")  # graph break: print
        if h.sum().item() > 0:  # graph break: Python branch on a tensor value
            h = h * 2
        h = torch.special.i0(h / 8)  # fallback: no StableHLO lowering for i0
        return self.decode(h)


def main() -> None:
    torch.manual_seed(0)
    model = Demo().eval()
    with torch.no_grad():
        report = tpu_inductor.explain(model, torch.randn(8, 16))
        compiled = torch.compile(model, backend="tpu")
        for batch in (8, 8, 12):  # 12: a new shape, so Dynamo recompiles
            compiled(torch.randn(batch, 16))
    print()
    print(report)


if __name__ == "__main__":
    main()
