"""The torch provider's implementations, one module per family, each exporting ``TORCH_OPS``."""
