"""Tests of the shell scripts in scripts/."""
