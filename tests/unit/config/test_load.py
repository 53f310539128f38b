"""Loading a run config (`config/load.py`): a preset, then a YAML file, then KEY=VALUE overrides; values
coerced to each key's type; the one `resolve_vocab`; overrides that cross a process boundary unchanged."""

import os

import pytest
import yaml

from iattention.config import GPTConfig
from iattention.config.load import (
    config_from_dict,
    default_heads,
    load_config,
    model_preset,
    override,
    parse_override,
    preset_names,
    resolve_vocab,
)
from iattention.errors import UserError


def test_a_yaml_file_overrides_the_preset_and_an_override_overrides_both(tmp_path):
    preset = load_config("tiny")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"optim": {"lr": preset.optim.lr * 2, "warmup_steps": 7}}))
    from_file = load_config("tiny", str(path))
    assert from_file.optim.lr == preset.optim.lr * 2 and from_file.optim.warmup_steps == 7
    assert from_file.model == preset.model  # sections the file does not name stay the preset's
    both = load_config("tiny", str(path), ["optim.lr=0.5"])
    assert both.optim.lr == 0.5 and both.optim.warmup_steps == 7


def test_a_saved_config_reloads_as_the_same_config():
    cfg = load_config("tiny", None, ["model.n_head=4", "train.seed=3"])
    assert config_from_dict(cfg.to_dict()) == cfg
    assert load_config(None, None, ["train.seed=5"], base=cfg.to_dict()).train.seed == 5


@pytest.mark.parametrize("text, value", [("optim.lr=1e-3", 1e-3), ("optim.lr=2", 2.0), ("train.amp=false", False),
                                         ("train.epochs=3", 3), ("data.tokenizer=bpe:300", "bpe:300")])
def test_override_values_are_coerced_to_the_key_s_type(text, value):
    section, key = text.split("=")[0].split(".")
    got = getattr(getattr(load_config("tiny", None, [text]), section), key)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text, must", [
    ("train.epochs=two", ["train.epochs", "int", "'two'"]),
    ("train.amp=3", ["train.amp", "bool"]),
    ("optim.colour=red", ["optim.colour", "lr"]),  # the unknown key and the keys allowed
    ("optim.lr", ["'optim.lr'", "KEY=VALUE"]),
    ("lr=3", ["SECTION.KEY"]),
])
def test_a_bad_override_names_the_key_and_what_it_takes(text, must):
    with pytest.raises(UserError) as err:
        load_config("tiny", None, [text])
    for m in must:
        assert m in str(err.value)


def test_an_unknown_section_or_preset_names_the_choices(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("modle: {n_head: 2}\n")
    with pytest.raises(UserError, match=r"modle.*allowed.*model"):
        load_config(None, str(path))
    with pytest.raises(UserError) as err:
        load_config("tinny")
    assert "'tinny'" in str(err.value) and "tiny" in str(err.value).split("'tinny'")[1]
    assert "gpt2-small" in preset_names() and "tiny" in preset_names()
    assert load_config("gpt2-small").model == load_config("paper").model


def test_a_config_file_that_is_not_a_mapping_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(UserError, match=str(path)):
        load_config("tiny", str(path))


@pytest.mark.parametrize("value", ["/data/a #b", "x: y", "!tag", "[1, 2]", "{a: 1}", "trail ", "two\nlines",
                                   "naïve 日本", "1e-3", "true", ""])
def test_an_override_written_by_override_reads_back_as_its_value(value):
    assert parse_override(override("data.train", value)) == {"data": {"train": value}}


def test_resolve_vocab_fills_zero_and_refuses_a_vocabulary_smaller_than_the_tokenizer():
    assert resolve_vocab(GPTConfig(vocab_size=0), "byte").vocab_size == 256
    assert resolve_vocab(GPTConfig(vocab_size=0), "bpe:300", 280).vocab_size == 280  # as built, not as named
    assert resolve_vocab(GPTConfig(vocab_size=512), "byte", 256).vocab_size == 512
    with pytest.raises(UserError) as err:
        resolve_vocab(GPTConfig(vocab_size=100), "byte", 256)
    assert "model.vocab_size=256" in str(err.value)  # the fix
    assert model_preset("tiny").vocab_size == 256  # a preset's model: its byte tokenizer's vocabulary


def test_default_heads_divide_the_width_up_to_the_preset_s_heads():
    assert default_heads(GPTConfig(n_embd=48, n_head=12)) == [1, 2, 4, 8, 12]
    assert default_heads(GPTConfig(n_embd=36, n_head=12)) == [1, 2, 4, 12]
    assert default_heads(GPTConfig(n_embd=32, n_head=2)) == [1, 2]


def test_init_from_is_stored_absolute_and_a_saved_run_s_own_value_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("tiny", None, ["train.init_from=runs/a"])
    assert cfg.train.init_from == os.path.join(str(tmp_path), "runs", "a")
    saved = cfg.to_dict()
    saved["train"]["init_from"] = "runs/old"  # a run recorded with a relative path
    assert load_config(None, None, [], base=saved).train.init_from == "runs/old"


def test_a_model_section_with_family_llama_is_a_llama_shaped_config_that_round_trips():
    from iattention.config import config_from_dict, load_config

    cfg = load_config("llama-cpu", None, ["model.n_kv_head=1", "model.rope_scaling={}"])
    assert cfg.model.family == "llama" and cfg.model.n_kv_head == 1 and cfg.model.vocab_size == 0
    assert (cfg.model.pos, cfg.model.norm, cfg.model.mlp, cfg.model.mlp_hidden) == ("rope", "rmsnorm", "swiglu", 512)
    assert cfg.model.d_head == 64 and cfg.model.rot == 64  # from n_embd / n_head when not given
    saved = cfg.to_dict()
    assert saved["model"]["family"] == "llama" and config_from_dict(saved) == cfg
    assert load_config("tiny").model.family == "gpt2" and "family" not in load_config("tiny").to_dict()["model"]
    # a saved two-family run's model section (arch: llama, d_ff, rms_eps) reads as the same config
    old = {k: v for k, v in saved["model"].items() if k not in ("family", "mlp_hidden")}
    old = {**saved, "model": {**old, "arch": "llama", "d_ff": 512, "rms_eps": cfg.model.norm_eps}}
    assert config_from_dict(old) == cfg
    assert load_config("tiny", None, ["model.arch=gpt"]).model.family == "gpt2"


def test_an_unknown_arch_or_family_or_a_misspelt_key_is_one_line():
    from iattention.config import load_config

    with pytest.raises(UserError, match=r"unknown model.arch 'mamba'; model.family says the architecture now"):
        load_config("tiny", None, ["model.arch=mamba"])
    with pytest.raises(UserError, match=r"unknown model.family 'mamba'; choose one of gpt2, llama"):
        load_config("tiny", None, ["model.family=mamba"])
    with pytest.raises(UserError, match=r"unknown config key model.biass; allowed keys: .*n_kv_head"):
        load_config("llama-cpu", None, ["model.biass=false"])
