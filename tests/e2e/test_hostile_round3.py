"""Hostile inputs, third round (issue 41), one section per class: values that cross a process boundary,
foreign tokenizers, untied heads, token caches (concurrent fills, swapped files), exports, signals during
start-up, launchers, a missing home folder, repeated grid values."""

import os

import pytest
import yaml

from helpers import write_corpus
from iattention.cli import main
from iattention.config import override, parse_override

# ------------------------------------------------------------------ values that cross a process boundary
HOSTILE_VALUES = ["/d/D #2", "/d/a: b", "!tag", "[x", "{y", "trailing ", " leading", "naïve—ü", "a\nb", "it's \"q\"",
                  "\\back", "#", "", "-", "~", "null", "yes", "1e3", "0x10", "\udcff"]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_an_override_made_from_a_value_reads_back_as_that_value(value):
    """Every override the tool builds for a child process (a sweep's `iattn train`) is read back by the child
    as exactly the value given: never as a YAML comment, mapping, tag, list, another type or a stripped string."""
    key, text = override("data.data_dir", value).split("=", 1)
    assert key == "data.data_dir"
    assert parse_override(f"{key}={text}") == {"data": {"data_dir": value}}


@pytest.mark.slow
def test_a_sweep_trains_on_the_data_folder_named_not_a_prefix_of_it(tmp_path):
    """`--data-dir "D #2: [x] {y} ü "` reached the sweep's children as a YAML override, where ' #' began a
    comment: they trained on D. Each child must record (and read) the folder exactly as given."""
    hostile = tmp_path / "D #2: [x] {y} ü "
    for folder, seed in ((hostile, 0), (tmp_path / "D", 1)):  # D: a decoy holding other text
        (folder / "wikitext-2-v1").mkdir(parents=True)
        paths = write_corpus(folder, seed=seed)
        for split, p in paths.items():
            os.replace(p, folder / "wikitext-2-v1" / f"wiki.{split}.tokens")
    out = tmp_path / "sw"
    rc = main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", "--out", str(out),
               "--data-dir", str(hostile), "train.epochs=1", "train.threads=1", f"data.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    config = yaml.safe_load((out / "standard-h2-s0" / "config.yaml").read_text())
    assert config["data"]["data_dir"] == str(hostile)
