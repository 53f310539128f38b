"""Symmetry tools: random gauge moves, canonical form, expansion, counts and balancedness."""

from iattention.symmetry.balance import balancedness
from iattention.symmetry.blocks import BLOCKS, condition_numbers
from iattention.symmetry.counts import (
    bias_redundancy,
    fully_reduced_count,
    iso_param_mlp_hidden,
    param_count,
    redundancy,
    standard_param_count,
)
from iattention.symmetry.transforms import (
    canonicalize,
    canonicalize_into,
    expand,
    fold_biases,
    load_into,
    random_gauge,
    select_blocks,
)

__all__ = [
    "BLOCKS", "balancedness", "bias_redundancy", "canonicalize", "canonicalize_into", "condition_numbers", "expand",
    "fold_biases", "fully_reduced_count", "iso_param_mlp_hidden", "load_into", "param_count", "random_gauge",
    "redundancy", "select_blocks",
    "standard_param_count",
]
