"""The step-4 check kinds, one module each: params, probe, ``Check`` class, label and typical time
(docs/adding-a-check-kind.md)."""
