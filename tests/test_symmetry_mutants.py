"""Survivors of `make mutation` in symmetry turned into checks (tests/mutation/SCORES.md)."""
