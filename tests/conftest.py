"""pytest set-up only (fixtures); what tests share lives in tests/helpers.py."""

from pathlib import Path

import pytest
import torch

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items):
    """Every test under tests/e2e/ is marked e2e, so `-m "not e2e"` leaves the layer out."""
    for item in items:
        if Path(item.path).resolve().is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_remembered_data_folder(tmp_path_factory, monkeypatch, request):
    """Tests never read (or write) the data folder remembered for the user (`iattn data remember`); each test
    has its own config folder (created only if written)."""
    import hashlib

    key = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "xdg-config" / key))
