"""End-to-end: `iattn params` of the shape-only Llama presets (totals, split, cache bytes), the family taken from
the preset name, and shape presets refused as run presets."""

import json

from helpers import one_line_error
from iattention.cli.app import main
from iattention.config.shapes import SHAPES, published_count

PUBLISHED = {name: published_count(name) for name in ("llama-3-8b", "smollm2-135m", "qwen2.5-0.5b")}


def test_params_prints_the_totals_and_the_split(capsys):
    assert main(["params", "--arch", "llama", "--preset", "llama-3-8b"]) == 0
    out = capsys.readouterr().out
    assert "standard       32   8    128   8,030,261,248" in out  # heads, KV heads, d_head, the published total
    assert "canonical      32   8    128   8,026,034,176     4,227,072       32,768    4,194,304" in out
    assert "full 131,072 B; K-only - (none: n_kv_head x d_head = 1024 < n_embd = 4096" in out
    assert main(["params", "--arch", "llama", "--preset", "smollm2-1.7b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["kv_cache_bytes_per_token"] == 2 * rows[0]["k_only_cache_bytes_per_token"] == 196_608
    for name, total in PUBLISHED.items():  # the family from the preset's name
        assert main(["params", "--preset", name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["params"] == total


def test_shape_presets_are_not_run_presets(capsys):
    for name in SHAPES:
        one_line_error(capsys, main(["train", "--preset", name, "--out", "/nonexistent/x"]), name)
    one_line_error(capsys, main(["params", "--arch", "llama", "--preset", "gpt2-small"]), "gpt2-small")
    one_line_error(capsys, main(["params", "--arch", "llama", "--heads", "2"]), "--heads")


def test_params_takes_the_family_from_the_preset_name_and_names_the_fix_otherwise(capsys):
    """`params --preset llama-3-8b` without --arch is the Llama count (the name says the family); --arch gpt with
    a Llama preset, or a name of neither family, is one line naming the fix."""
    for name in ("llama-3-8b", "llama-cpu"):
        assert main(["params", "--preset", name, "--json"]) == 0
        inferred = json.loads(capsys.readouterr().out)
        assert main(["params", "--arch", "llama", "--preset", name, "--json"]) == 0
        assert inferred == json.loads(capsys.readouterr().out) and inferred[0]["family"] == "llama"
        one_line_error(capsys, main(["params", "--arch", "gpt", "--preset", name]), name, "Llama", "--family llama")
        one_line_error(capsys, main(["params", "--family", "qwen2", "--preset", name]), name, "Llama",
                       "--family llama")
    assert main(["params", "--preset", "tiny", "--json"]) == 0  # a GPT-2 preset stays GPT-2
    assert {r["family"] for r in json.loads(capsys.readouterr().out)} == {"gpt2"}
    one_line_error(capsys, main(["params", "--preset", "llama-9"]), "unknown preset 'llama-9'", "gpt2-small",
                   "llama-3-8b")


def test_params_of_a_run_preset_with_its_own_kv_heads_takes_heads_as_compare_does(capsys):
    """llama-cpu (a run preset, 2 key/value heads): --heads 4,8 counts the models `compare --heads 4,8` trains
    (it was refused as "for GPT-2 presets"), each row with its own cache bytes (G r changes with the head
    count); a count its KV heads do not divide, or --heads on a published shape, is one line."""
    from iattention.config import load_config
    from iattention.model.gpt import GPT

    assert main(["params", "--preset", "llama-cpu", "--heads", "4,8", "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["attention"] == "standard"]
    for r in rows:
        cfg = load_config("llama-cpu", None, [f"model.n_head={r['n_head']}", "model.vocab_size=4096"]).model
        model = GPT(cfg)
        assert r["params"] == model.num_params() and r["d_head"] == 256 // r["n_head"] and r["n_kv_head"] == 2
        assert r["kv_cache_bytes_per_token"] == 2 * cfg.n_layer * 2 * 2 * cfg.d_head  # K and V, layers, G, r, bf16
    assert [r["n_head"] for r in rows] == [4, 8]
    one_line_error(capsys, main(["params", "--preset", "llama-cpu", "--heads", "3"]), "multiples of 2")
    one_line_error(capsys, main(["params", "--preset", "llama-3-8b", "--heads", "4"]), "drop --heads")


def test_params_from_a_converted_folder_reads_our_config_json(tmp_path, capsys):
    """`params --from` a folder `iattn convert` wrote (config.json: model_type iattention and our model config) is
    counted, not refused as "describes a 'iattention' model"."""
    import torch

    from helpers import make_llama
    from iattention.interop.convert import convert, save_converted

    src = make_llama(dtype=torch.float32)
    canon, rep = convert(src, "canonical", dtype="float32")
    save_converted(canon, tmp_path / "c", "canonical", rep, source="test")
    assert main(["params", "--from", str(tmp_path / "c"), "--json"]) == 0
    rows = {r["attention"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["standard"]["params"] == src.num_params() and rows["canonical"]["params"] == canon.num_params()


def test_params_family_counts_each_family_s_published_shape_and_arch_is_read_with_a_note(capsys):
    """--family NAME (every record's default shape; the old --arch still read, with a note on stderr): the published
    totals; --arch llama still takes any shape of the Llama layout (qwen2.5-0.5b), as it did."""
    from iattention.config.families import FAMILIES

    for fam in FAMILIES.values():
        assert main(["params", "--family", fam.name, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert {r["family"] for r in rows} == {fam.name}
        if fam.default_shape in SHAPES and published_count(fam.default_shape):  # gpt2's: the paper's run preset
            assert rows[0]["params"] == published_count(fam.default_shape)
    assert main(["params", "--arch", "llama", "--preset", "qwen2.5-0.5b", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["params"] == published_count("qwen2.5-0.5b")
    assert "--arch is now --family" in captured.err
    one_line_error(capsys, main(["params", "--arch", "llama", "--family", "llama"]), "--arch is the old name")
