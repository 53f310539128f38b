"""The data folder remembered for the user (`data/remember.py`): kept in $XDG_CONFIG_HOME/iattention/config.json,
written absolute, other keys kept, forgotten on request; a damaged file or a missing folder names the fix."""

import json

import pytest

from iattention.data.remember import config_file, forget_data_dir, remember_data_dir, remembered_data_dir
from iattention.errors import UserError


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "iattention" / "config.json"


def test_a_folder_is_remembered_absolute_and_forgotten(xdg, tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    assert config_file() == xdg and remembered_data_dir() is None
    assert remember_data_dir("data") == xdg
    assert remembered_data_dir() == str((tmp_path / "data").resolve())
    assert forget_data_dir() is True and remembered_data_dir() is None
    assert forget_data_dir() is False  # nothing left to forget


def test_other_settings_in_the_file_are_kept(xdg, tmp_path):
    xdg.parent.mkdir(parents=True)
    xdg.write_text(json.dumps({"theme": "dark"}))
    remember_data_dir(tmp_path)
    assert json.loads(xdg.read_text()) == {"theme": "dark", "data_dir": str(tmp_path.resolve())}
    forget_data_dir()
    assert json.loads(xdg.read_text()) == {"theme": "dark"}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"data_dir": 5}'])
def test_a_damaged_config_file_names_itself_and_the_fix(xdg, content):
    xdg.parent.mkdir(parents=True)
    xdg.write_text(content)
    with pytest.raises(UserError) as err:
        remembered_data_dir()
    assert str(xdg) in str(err.value) and "iattn data remember" in str(err.value)


def test_a_folder_that_does_not_exist_is_not_remembered(xdg, tmp_path):
    with pytest.raises(UserError) as err:
        remember_data_dir(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value) and not xdg.exists()


def test_a_relative_xdg_config_home_is_ignored_for_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/path")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_file() == tmp_path / ".config" / "iattention" / "config.json"
