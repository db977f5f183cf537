"""Step 4: framework bring-up — a real inference framework serves a model correctly on the device."""
