"""Survivors of `make mutation` in optim turned into checks (tests/mutation/SCORES.md)."""
