"""The six steps: matrix (1), smoke (2), ops (3), framework (4), perf (5), grade (6)."""
