"""The ladder: loading and validating YAML, the check-kind registry, and the isolated runner."""
