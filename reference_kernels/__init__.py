"""CPU float64 reference kernels for step 3 (operator numerics).

One module per op family, written from the formula with NumPy in float64: readable loops
and elementary array operations, never the fused op they check (no attention, norm or
softmax library call inside the attention, norm or softmax reference). Every function
takes and returns ``numpy.ndarray`` (float64 for values, int64 for indices) so the
reference is independent of the torch build under test.
"""
