"""Step 1: capture the compatibility matrix and check it against the rules in matrices/."""
