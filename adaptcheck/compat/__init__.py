"""Compatibility data and its arithmetic: installed versions, the version rules, the known-good stacks.

Step 1's checks (:mod:`adaptcheck.steps.matrix`) judge a machine with them; ``adaptcheck
fleet`` exports and merges stacks with them. Data: ``matrices/rules.yaml`` and
``matrices/known_good.yaml`` (strict schemas, ``file:line`` errors, every entry sourced).
"""
