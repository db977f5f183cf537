"""Step 3: every LLM operator on the device against CPU float64 reference kernels — operator
definitions (:mod:`.opdef`, :mod:`.families`, :mod:`.catalog`), providers under test
(:mod:`.providers`), the tolerance policy (:mod:`.tolerance`), the comparison (:mod:`.judge`),
the runner and the ``ops.op`` check kind (:mod:`.harness`, :mod:`.checks`). Docs: docs/ops.md;
adding an operator: docs/adding-an-op.md.
"""
