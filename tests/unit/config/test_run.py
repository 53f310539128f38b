"""The run config's sections (`config/run.py`): every optimizer and loop setting checked where it is made,
the refusal naming the key, the rule and an example to copy; NaN and infinity refused for any float."""

import math

import pytest

from iattention.config.run import MAX_THREADS, LoopConfig, OptimConfig, RunConfig
from iattention.errors import UserError


@pytest.mark.parametrize("key, bad, ok", [
    ("lr", 0.0, 1e-3), ("min_lr_ratio", 1.5, 1.0), ("warmup_steps", -1, 0), ("weight_decay", -0.1, 0.0),
    ("beta1", 1.0, 0.0), ("beta2", -0.1, 0.999), ("grad_clip", -1.0, 0.0), ("schedule", "step", "linear"),
    ("name", "sgd", "muon"),
])
def test_an_optimizer_setting_out_of_range_names_the_key_and_an_example(key, bad, ok):
    assert getattr(OptimConfig(**{key: ok}), key) == ok  # the edge of the range is accepted
    with pytest.raises(UserError) as err:
        OptimConfig(**{key: bad})
    message = str(err.value)
    assert f"optim.{key} must be" in message and repr(bad) in message and f"e.g. optim.{key}=" in message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_that_is_not_finite_is_refused_whatever_the_rule(value):
    for key in ("lr", "weight_decay", "grad_clip"):
        with pytest.raises(UserError, match=f"optim.{key} must be"):
            OptimConfig(**{key: value})


@pytest.mark.parametrize("key, bad, ok", [
    ("epochs", 0, 1), ("batch_size", 0, 1), ("grad_accum", 0, 1), ("eval_batch_size", 0, 1), ("seed", -1, 0),
    ("seed", 2**63, 2**63 - 1), ("eval_every_steps", -1, 0), ("ckpt_every_steps", -1, 0), ("patience", -1, 0),
    ("threads", -1, 0), ("threads", MAX_THREADS + 1, MAX_THREADS), ("compile_scope", "layers", "blocks"),
    ("compile_mode", "cudagraphs", "reduce-overhead"),
])
def test_a_loop_setting_out_of_range_names_the_key_and_an_example(key, bad, ok):
    compile = {"compile": True} if key.startswith("compile_") else {}
    assert getattr(LoopConfig(**{key: ok}, **compile), key) == ok
    with pytest.raises(UserError) as err:
        LoopConfig(**{key: bad}, **compile)
    assert f"train.{key} must be" in str(err.value) and f"e.g. train.{key}=" in str(err.value)


@pytest.mark.parametrize("key, value", [("compile_scope", "blocks"), ("compile_mode", "max-autotune")])
def test_a_compile_setting_without_compile_is_refused_naming_the_fix(key, value):
    assert getattr(LoopConfig(compile=True, **{key: value}), key) == value
    with pytest.raises(UserError) as err:
        LoopConfig(**{key: value})
    assert f"train.{key}={value}" in str(err.value) and "train.compile=true" in str(err.value)


def test_a_device_other_than_auto_cpu_or_cuda_names_the_choices():
    with pytest.raises(UserError) as err:
        LoopConfig(device="gpu")
    assert all(m in str(err.value) for m in ("train.device", "'gpu'", "auto", "cpu", "cuda"))


def test_a_run_config_as_a_dict_has_its_four_sections_and_the_tokenizer_s_vocabulary_by_default():
    d = RunConfig().to_dict()
    assert list(d) == ["model", "data", "optim", "train"]
    assert d["model"]["vocab_size"] == 0  # "from the tokenizer", resolved when the data is known
