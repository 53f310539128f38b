"""Unit tests of iattention.config.identity."""

import json

from iattention.config import config_mismatch, extends, load_config


def test_run_identity_ignores_execution_keys_and_sees_extensions():
    a = load_config("cpu-quick").to_dict()
    b = load_config("cpu-quick", overrides=["train.threads=2", "data.data_dir=/elsewhere"]).to_dict()
    assert config_mismatch(a, b) is None
    c = load_config("cpu-quick", overrides=["optim.lr=1e-3"]).to_dict()
    assert "optim.lr" in config_mismatch(a, c)
    longer = load_config("cpu-quick", overrides=[f"train.epochs={a['train']['epochs'] + 1}"]).to_dict()
    assert extends(a, longer) and not extends(longer, a)


def test_a_larger_budget_of_any_kind_may_extend_a_run_and_a_smaller_one_of_its_kind_never():
    """train.max_steps / train.max_tokens extend like train.epochs: larger of the same kind extends, smaller
    or equal does not; another kind may (only the step reached tells: the trainer refuses a shorter one);
    any other change is another run."""
    base = load_config("tiny", None, []).to_dict()

    def with_(**train):
        d = json.loads(json.dumps(base))
        d["train"].update(train)
        return d

    steps = with_(max_steps=30)
    assert extends(steps, with_(max_steps=40)) and not extends(steps, with_(max_steps=30))
    assert not extends(steps, with_(max_steps=20))
    assert extends(with_(max_tokens=1000), with_(max_tokens=2000)) and not extends(with_(max_tokens=2000),
                                                                                with_(max_tokens=1000))
    assert extends(steps, with_(max_tokens=5000)) and extends(base, steps) and extends(steps, with_(epochs=9))
    assert not extends(steps, with_(max_steps=40, seed=1))


def test_a_llama_family_key_at_gpt2_s_default_is_still_a_difference():
    """A family key left out where it holds its family's value, and kept otherwise, even where it holds GPT-2's
    default: a tied and an untied Llama, or a Qwen2 with and without query/key/value biases, are two runs."""
    def cfg(*ov):
        return load_config("llama-cpu", None, list(ov)).to_dict()

    assert "model.tie_embeddings" in config_mismatch(cfg(), cfg("model.tie_embeddings=false"))
    qwen = ("model.family=qwen2",)
    assert "model.qkv_bias" in config_mismatch(cfg(*qwen), cfg(*qwen, "model.qkv_bias=false"))
    assert config_mismatch(cfg(), cfg("model.tie_embeddings=true", "model.norm_eps=1e-6")) is None
