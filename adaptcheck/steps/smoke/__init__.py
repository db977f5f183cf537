"""Step 2: tensor smoke tests on the selected device."""
