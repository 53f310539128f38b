"""Attention mechanics lab: closed-form predictions vs measurements for single-query attention."""

from iattention.lab.average import run_average
from iattention.lab.copy_task import run_copy
from iattention.lab.subspace import run_subspace
from iattention.lab.variance import VarianceSetting, run_multi_head, run_multi_head_sweep, run_single_head

__all__ = ["VarianceSetting", "run_average", "run_copy", "run_multi_head", "run_multi_head_sweep",
           "run_single_head", "run_subspace"]
