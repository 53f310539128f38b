"""pytest set-up only (fixtures); what tests share lives in tests/helpers.py."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
