"""Unit tests of iattention.config.identity."""

from iattention.config import config_mismatch, extends, load_config


def test_run_identity_ignores_execution_keys_and_sees_extensions():
    a = load_config("cpu-quick").to_dict()
    b = load_config("cpu-quick", overrides=["train.threads=2", "data.data_dir=/elsewhere"]).to_dict()
    assert config_mismatch(a, b) is None
    c = load_config("cpu-quick", overrides=["optim.lr=1e-3"]).to_dict()
    assert "optim.lr" in config_mismatch(a, c)
    longer = load_config("cpu-quick", overrides=[f"train.epochs={a['train']['epochs'] + 1}"]).to_dict()
    assert extends(a, longer) and not extends(longer, a)
