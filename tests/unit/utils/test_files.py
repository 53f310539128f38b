"""Unit tests of iattention.utils.files."""

import pytest

from iattention.errors import UserError


def test_the_root_is_refused_as_out():
    from iattention.utils.files import check_out_folder

    with pytest.raises(UserError, match="file system root"):
        check_out_folder("/")
    with pytest.raises(UserError, match="file system root"):
        check_out_folder("/tmp/..")


def test_a_yaml_merge_key_is_read(tmp_path):
    """Before: `<<: *base` was "not valid YAML" (the duplicate-key check constructed the merge key)."""
    from iattention.utils.files import read_yaml

    path = tmp_path / "c.yaml"
    path.write_text("base: &b {epochs: 1, seed: 3}\ntrain:\n  <<: *b\n  seed: 4\n")
    assert read_yaml(path, "config file", "fix it")["train"] == {"epochs": 1, "seed": 4}
    path.write_text("train:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(UserError, match="appears twice"):  # a real repeat is still refused
        read_yaml(path, "config file", "fix it")
