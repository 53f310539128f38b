"""Symmetry tools: random gauge moves, canonical form, expansion, counts and balancedness."""

from iattention.symmetry.balance import balancedness
from iattention.symmetry.blocks import BLOCKS, condition_numbers, select_blocks
from iattention.symmetry.counts import param_count, redundancy, standard_param_count
from iattention.symmetry.transforms import canonicalize, expand, random_gauge

__all__ = [
    "BLOCKS", "balancedness", "canonicalize", "condition_numbers", "expand", "param_count",
    "random_gauge", "redundancy", "select_blocks", "standard_param_count",
]
