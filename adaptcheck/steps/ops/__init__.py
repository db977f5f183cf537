"""Step 3: every LLM operator on the device against CPU float64 reference kernels.

* :mod:`.opdef` — what an operator is: its case model, input generator, reference, tolerance class.
* :mod:`.catalog` — every operator, collected from :mod:`.families`.
* :mod:`.providers` — implementations under test (torch, vLLM, plugins, ``--ops``).
* :mod:`.tolerance` / :mod:`.compare` — the tolerance policy (data in matrices/) and the metrics.
* :mod:`.harness` / :mod:`.checks` — run one op over cases × dtypes; the ``ops.op`` check kind.
"""
