"""Tests of step 2, tensor smoke."""
