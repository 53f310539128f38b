"""End-to-end: `iattn convert` of a Llama-family folder streams (issue 50 §2, §3): the report's two checks, the exit
code over a tolerance and --force, a bad --shard-size, and the round trip back to a folder transformers loads."""

import json

import pytest
import torch

from helpers import one_line_error
from iattention.cli import main
from iattention.interop import convert as convert_module

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()


@pytest.fixture
def qwen(tmp_path):
    torch.manual_seed(0)
    cfg = tf.Qwen2Config(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = tf.Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(tmp_path / "qwen"), max_shard_size="30KB")
    return tmp_path / "qwen"


def test_a_llama_family_folder_converts_both_ways_with_both_checks_reported(qwen, tmp_path, capsys):
    assert main(["convert", "--from", str(qwen), "--to", "canonical", "--out", str(tmp_path / "c"), "--per-head"]) == 0
    out = capsys.readouterr().out
    assert "[bfloat16]" in out and "worst layer" in out
    # --per-head, as for a model converted whole: under each layer's worst KV group, each group's, pivoted blocks
    lines = out.splitlines()
    layers = [i for i, line in enumerate(lines) if line.startswith("  layer ")]
    assert len(layers) == 2
    for i in layers:  # "  layer  0: 3.5e-16 | 4.4e-08; rotary pivot ratio min 0.31 | 0.036; output cond max 4.4 | 22"
        rotary, output = (float(p.split(" | ")[0].split()[-1]) for p in lines[i].split("; ")[1:])
        groups = {lines[i + k].split()[0]: [float(v) for v in lines[i + k].split()[1:]] for k in (1, 2)}
        assert {k: len(v) for k, v in groups.items()} == {"rotary": 2, "output": 2}  # Qwen2 rotates whole heads
        assert f"{min(groups['rotary']):.3g}" == f"{rotary:.3g}" and f"{max(groups['output']):.3g}" == f"{output:.3g}"
    assert "source load (ours vs transformers" in out and "conversion (converted vs source" in out
    assert main(["convert", "--from", str(tmp_path / "c"), "--to", "hf", "--out", str(tmp_path / "h"),
                 "--shard-size", "10KB"]) == 0
    out = capsys.readouterr().out
    assert "source load: not checked" in out and (tmp_path / "h" / "model.safetensors.index.json").exists()
    assert isinstance(tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "h")), tf.Qwen2ForCausalLM)


def test_a_check_over_its_tolerance_exits_2_unless_forced(qwen, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(convert_module.TOLERANCE, torch.bfloat16, 1e-9)
    rc = main(["convert", "--from", str(qwen), "--to", "canonical", "--out", str(tmp_path / "c")])
    one_line_error(capsys, rc, "conversion check failed", "nothing was written", "--force")
    assert not (tmp_path / "c").exists()
    assert main(["convert", "--from", str(qwen), "--to", "canonical", "--out", str(tmp_path / "c"), "--force"]) == 0
    assert "written anyway (--force)" in capsys.readouterr().out and (tmp_path / "c" / "config.json").exists()


def test_a_bad_shard_size_is_one_line(qwen, tmp_path, capsys):
    rc = main(["convert", "--from", str(qwen), "--to", "canonical", "--out", str(tmp_path / "c"),
               "--shard-size", "lots"])
    one_line_error(capsys, rc, "--shard-size 'lots' is not a size", "2GB")
    assert not (tmp_path / "c").exists()


def test_an_hf_llama_folder_to_hf_is_checked_against_its_own_class(qwen, tmp_path, capsys):
    """The whole-model route (HF folder -> HF folder): the reference is Qwen2ForCausalLM in float64, the converted
    model's logits in float64 too (its RoPE frequencies float32, as from_pretrained keeps them): both exact."""
    assert main(["convert", "--from", str(qwen), "--to", "hf", "--out", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "source load (ours vs transformers, float64 logits on the probe batch): 0.000e+00" in out
    assert "conversion (converted vs source, float64 logits on the probe batch): 0.000e+00" in out


IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@pytest.mark.parametrize("kind, ids", [("GPT2", (3, 4, 5)), ("GPTNeoX", (3, 4, 5)), ("Qwen2", (3, 4, None)),
                                       ("Llama", (3, [4, 6], 5)), ("GPTNeoX", (None, None, None)),
                                       ("Llama", (None, None, None))])
def test_an_export_says_the_token_ids_its_source_said(tmp_path, capsys, kind, ids):
    """HF -> canonical -> HF (streamed, except GPT-2) and canonical -> standard -> HF (whole-model): config.json and
    generation_config.json of both exports hold the source's bos/eos/pad (kept in the checkpoint's metadata), or
    None where the source set none, never the family class's defaults (GPTNeoXConfig's eos 2, LlamaConfig's 1 and
    2). Before: GPT-NeoX came back with eos 2, Qwen2/Llama/GPT-2 with None in config.json."""
    from fixtures import hf_folder

    src = hf_folder(tmp_path / "hf", kind, **dict(zip(IDS, ids)))
    for a, to, b in (("hf", "canonical", "c"), ("c", "hf", "h1"), ("c", "standard", "s"), ("s", "hf", "h2")):
        assert main(["convert", "--from", str(tmp_path / a), "--to", to, "--out", str(tmp_path / b)]) == 0
    capsys.readouterr()
    for out in (src, tmp_path / "h1", tmp_path / "h2"):
        config, gen = tf.AutoConfig.from_pretrained(str(out)), tf.GenerationConfig.from_pretrained(str(out))
        assert [getattr(config, k) for k in IDS] == [getattr(gen, k) for k in IDS] == list(ids), out.name


def test_a_streamed_export_of_a_source_without_generation_config_writes_one_with_its_ids(tmp_path, capsys):
    """A folder without generation_config.json (older checkpoints): the streamed export has nothing to copy and
    writes one from its config, as save_pretrained does, so the two files agree (GPT-NeoX: not eos 2)."""
    from fixtures import hf_folder

    src = hf_folder(tmp_path / "hf", "GPTNeoX", bos_token_id=3, eos_token_id=4)
    (src / "generation_config.json").unlink()
    assert main(["convert", "--from", str(src), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
    assert main(["convert", "--from", str(tmp_path / "c"), "--to", "hf", "--out", str(tmp_path / "h")]) == 0
    assert "copied tokenizer.json, tokenizer_config.json\n" in capsys.readouterr().out
    gen = tf.GenerationConfig.from_pretrained(str(tmp_path / "h"))
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (3, 4, None)


@pytest.mark.parametrize("settings, why", [({"max_new_tokens": 0}, "`max_new_tokens` must be greater than 0"),
                                           ({"do_sample": False, "num_return_sequences": 3}, "num_return_sequences"),
                                           ({"watermarking_config": 5}, "has no attribute")])
def test_a_generation_config_transformers_refuses_is_one_line_naming_it(tmp_path, capsys, settings, why):
    """A source's generation_config.json that transformers refuses while it loads the model: the streamed
    conversion ended in a traceback (after loading the folder for its check), eval blamed the weights ("cannot
    load ... from safetensors; re-save it"). Now one line names the file, before anything is written."""
    from fixtures import hf_folder

    src = hf_folder(tmp_path / "hf", "Llama")
    (src / "generation_config.json").write_text(json.dumps(settings))
    (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 20)
    for argv in (["convert", "--from", str(src), "--to", "canonical", "--out", str(tmp_path / "c")],
                 ["eval", str(src), "--text", str(tmp_path / "t.txt")]):
        one_line_error(capsys, main(argv), "generation_config.json", "refused by transformers", why, "fix or remove")
    assert not (tmp_path / "c").exists()
    (src / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))  # only a warning
    assert main(["convert", "--from", str(src), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
    (tmp_path / "c" / "generation_config.json").write_text(json.dumps(settings))  # and the streamed way back
    one_line_error(capsys, main(["convert", "--from", str(tmp_path / "c"), "--to", "hf", "--out", str(tmp_path / "h")]),
                   "generation_config.json", "refused by transformers", why)
    assert not (tmp_path / "h").exists()
