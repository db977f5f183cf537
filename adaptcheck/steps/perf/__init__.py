"""Step 5 check kinds: micro-benchmarks against the device peak, and serving scenarios."""
