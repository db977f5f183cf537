"""Step 5 library: timing, device peaks, micro-benchmarks, the serving load generator and its metrics."""
