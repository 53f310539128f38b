"""Where a split's text comes from (`data/sources.py`): the data folder asked for, else $IATTN_DATA_DIR,
else the remembered one; the official file inside it (under the release's folder or at its top); plain
text files for dataset=text; every file that is not UTF-8 text refused naming the file and the fix."""

import pytest

from iattention.data.config import DataConfig
from iattention.data.remember import remember_data_dir
from iattention.data.sources import data_dir, data_dir_told, read_split, read_text_file, resolved_data_dir
from iattention.errors import UserError


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.delenv("IATTN_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    out = {}
    for name in ("flag", "env", "remembered"):
        out[name] = tmp_path / name
        (out[name] / "wikitext-2-v1").mkdir(parents=True)
        (out[name] / "wikitext-2-v1" / "wiki.valid.tokens").write_text(f"valid text from {name}\n")
    return out


def test_the_folder_asked_for_wins_then_the_environment_then_the_remembered_one(folders, monkeypatch):
    cfg = DataConfig(dataset="wikitext-2-v1")
    assert data_dir(cfg) is None and resolved_data_dir(cfg) == ""  # none: a download
    remember_data_dir(folders["remembered"])
    assert read_split(cfg, "valid") == "valid text from remembered\n"
    monkeypatch.setenv("IATTN_DATA_DIR", str(folders["env"]))
    assert read_split(cfg, "valid") == "valid text from env\n"
    assert data_dir_told(None) == str(folders["env"].resolve())
    told = DataConfig(dataset="wikitext-2-v1", data_dir=str(folders["flag"]))
    assert read_split(told, "valid") == "valid text from flag\n"
    assert resolved_data_dir(told) == str(folders["flag"].resolve())
    assert data_dir_told(str(folders["flag"])) == str(folders["flag"].resolve())


def test_the_official_file_is_found_at_the_folder_s_top_too(tmp_path):
    (tmp_path / "wiki.test.raw").write_text("raw test\n")
    assert read_split(DataConfig(dataset="wikitext-2-raw-v1", data_dir=str(tmp_path)), "test") == "raw test\n"


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_a_data_folder_that_is_not_a_folder_names_it_and_the_release_expected(tmp_path, what):
    path = tmp_path / "data"
    if what == "a file":
        path.write_text("x")
    with pytest.raises(UserError) as err:
        read_split(DataConfig(dataset="wikitext-2-v1", data_dir=str(path)), "train")
    assert str(path) in str(err.value) and "wikitext-2-v1/" in str(err.value) and "--data-dir" in str(err.value)


@pytest.mark.parametrize("content, must", [(b"", "empty"), (b"  \n", "empty"), (b"a\x00b", "binary"),
                                           (b"caf\xe9\n", "UTF-8")])
def test_a_text_file_that_is_not_utf8_text_names_the_file_and_why(tmp_path, content, must):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(UserError) as err:
        read_text_file(path)
    assert str(path) in str(err.value) and must in str(err.value)


def test_dataset_text_reads_each_split_s_file_and_names_a_missing_path(tmp_path):
    (tmp_path / "v.txt").write_text("naïve\n", encoding="utf-8")
    cfg = DataConfig(dataset="text", valid=str(tmp_path / "v.txt"))
    assert read_split(cfg, "valid") == "naïve\n"
    with pytest.raises(UserError, match=r"data\.train=PATH"):
        read_split(cfg, "train")
    with pytest.raises(UserError) as err:
        read_split(DataConfig(dataset="wikitext-3"), "train")
    assert "'wikitext-3'" in str(err.value) and "wikitext-2-v1" in str(err.value) and "text" in str(err.value)
