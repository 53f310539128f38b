"""End-to-end: a Hugging Face Llama / Qwen2 / Mistral folder saved with its own tokenizer works as it is:
`iattn eval DIR --text f` scores what transformers' own model and tokenizer score (BOS as the tokenizer adds
it), counts the text's bytes exactly, `iattn generate DIR` continues as transformers' greedy generate does; a
folder without a tokenizer.json, or with a tokenizer past the model's embedding, is one line."""

import json
import re

import pytest
import torch
import torch.nn.functional as F

from fixtures import UNICODE, hf_folder
from helpers import one_line_error
from iattention.cli.app import main
from iattention.interop.load import load_run

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()

TEXT = "the cat sat on a naïve café mat .\n" + UNICODE + "the dog 😀 ran , 1,234.5\n"
KINDS = ["Llama", "Qwen2", "Mistral"]


def _reference(folder, text):
    """transformers' own: the tokenizer's ids (with its BOS) and the mean NLL of ids[1:] in float64."""
    tok = tf.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float64).eval()
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        logits = model(ids).logits
    return tok, model, ids[0], F.cross_entropy(logits[0, :-1], ids[0, 1:]).item()


@pytest.mark.parametrize("kind", KINDS)
def test_eval_of_a_folder_with_its_own_tokenizer_is_transformers_nll(tmp_path, capsys, kind):
    folder = str(hf_folder(tmp_path / kind, kind))
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    tok, _, ids, nll = _reference(folder, TEXT)
    assert (ids[0] == tok.bos_token_id) == (kind != "Qwen2")  # Llama and Mistral put BOS first, Qwen2 none
    # one window over the whole text: every token predicted from all before it, as in the reference
    assert main(["eval", folder, "--text", str(tmp_path / "t.txt"), "--block-size", str(len(ids) - 1),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == len(ids) - 1 and got["tokenizer"] == f"hf:{folder}"
    assert abs(got["loss"] - nll) < 1e-5 * nll, (got["loss"], nll)
    first = b"" if kind != "Qwen2" else tok.decode(ids[:1]).encode("utf-8")  # without BOS: context only
    assert got["bytes"] == len(TEXT.encode("utf-8")) - len(first)
    assert got["words"] == len(re.split(r"\s+", TEXT.encode("utf-8")[len(first):].decode("utf-8")))  # lm-eval's


@pytest.mark.parametrize("kind", KINDS)
def test_generate_from_a_folder_is_transformers_greedy(tmp_path, capsys, kind):
    folder = str(hf_folder(tmp_path / kind, kind, seed=1))
    prompt = "the cat sat"
    tok = tf.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float64).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[0]
    new = out[ids.shape[1]:].tolist()
    assert len(new) == 12
    ours, tokenizer = load_run(folder)
    assert tokenizer.encode(prompt).tolist() == ids[0].tolist()
    assert ours.generate(torch.as_tensor(tokenizer.encode(prompt))[None], 12, temperature=0)[0].tolist() == \
        out.tolist()
    assert main(["generate", folder, "--prompt", prompt, "--max-new-tokens", "12", "--temperature", "0"]) == 0
    # the continuation's exact bytes: its first piece keeps the space it starts with (decode would drop it)
    assert capsys.readouterr().out == prompt + tokenizer.decode_bytes(new).decode("utf-8", errors="replace") + "\n"


@pytest.mark.parametrize("kind", ["Llama", "Qwen2"])
def test_the_exact_bytes_of_a_text_and_of_its_pieces(tmp_path, kind):
    """decode_bytes gives the text back byte for byte from a document's start, and mid-text each piece's own
    bytes: what transformers decodes a sequence to, with the space before a continuation kept."""
    _, tok = load_run(str(hf_folder(tmp_path / kind, kind)))
    theirs = tf.AutoTokenizer.from_pretrained(str(tmp_path / kind))
    ids = tok.encode(TEXT)
    assert tok.exact_bytes and tok.decode_bytes(ids, at_start=True) == TEXT.encode("utf-8")
    assert tok.decode_bytes(ids[1:]).decode("utf-8") == theirs.decode(ids[1:]) or kind == "Llama"
    whole = tok.decode_bytes(ids, at_start=True)
    assert whole.endswith(tok.decode_bytes(ids[5:]))  # mid-text: "▁cat" is " cat"


def test_a_folder_without_a_tokenizer_keeps_the_one_line_error(tmp_path, capsys):
    folder = str(hf_folder(tmp_path / "m", "Llama", tokenizer=False))
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    rc = main(["eval", folder, "--text", str(tmp_path / "t.txt")])
    one_line_error(capsys, rc, "does not say which tokenizer it was trained with", "--tokenizer")
    # --tokenizer still chooses: the model's folder, or another one
    other = str(hf_folder(tmp_path / "other", "Llama"))
    assert main(["eval", folder, "--text", str(tmp_path / "t.txt"), "--tokenizer", f"hf:{other}",
                 "--block-size", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == f"hf:{other}"


def test_a_tokenizer_past_the_embedding_is_refused_in_one_line(tmp_path, capsys):
    folder = str(hf_folder(tmp_path / "m", "Qwen2", vocab_size=200))  # the tokenizer has 312 ids
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    rc = main(["eval", folder, "--text", str(tmp_path / "t.txt")])
    one_line_error(capsys, rc, "tokens, more than the model's 200", "--tokenizer")
    rc = main(["generate", folder, "--prompt", "the cat"])
    one_line_error(capsys, rc, "tokens, more than the model's 200", "--tokenizer")


def test_a_text_the_tokenizer_does_not_keep_gets_no_per_byte_figures(tmp_path, capsys):
    """Qwen2's tokenizer normalizes to NFC: a decomposed "é" is scored as the composed one, whose bytes are not
    the file's, so per-byte and per-word figures are not given rather than given for another text."""
    folder = str(hf_folder(tmp_path / "m", "Qwen2"))
    (tmp_path / "t.txt").write_text(TEXT.replace("é", "e\u0301"), encoding="utf-8")
    assert main(["eval", folder, "--text", str(tmp_path / "t.txt"), "--block-size", "8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["bytes"] is None and got["bits_per_byte"] is None and got["ppl"] > 0
    assert main(["eval", folder, "--text", str(tmp_path / "t.txt"), "--block-size", "8"]) == 0
    assert "does not give back the exact bytes of this text" in capsys.readouterr().out


def test_init_from_a_folder_trains_on_its_own_tokenizer_and_the_run_keeps_it(tmp_path, capsys):
    """`iattn train --init-from DIR` tokenizes the run's data with the folder's tokenizer (recorded as
    hf:FOLDER), so that eval and generate of the run find it; data.tokenizer= naming another is refused."""
    from helpers import write_corpus

    folder = hf_folder(tmp_path / "src", "Llama")
    paths = write_corpus(tmp_path)
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    shape = ["model.n_layer=2", "model.n_embd=32", "model.mlp_hidden=48", "model.block_size=32",
             "model.tie_embeddings=false", "train.epochs=1", "train.batch_size=8", "optim.warmup_steps=0"]
    data = ["data.dataset=text", *(f"data.{s}={paths[s]}" for s in ("train", "valid", "test")),
            "data.train_tokens=0", f"data.cache_dir={tmp_path / 'c'}"]
    run = tmp_path / "run"
    assert main(["train", "--preset", "llama-cpu", "--out", str(run), "--quiet", "--init-from", str(folder),
                 *data, *shape]) == 0
    assert f"tokenizer: hf:{folder}" in (run / "config.yaml").read_text()
    # the command that started it resumes it: the preset given again does not put its own tokenizer back (it was
    # refused: "data.tokenizer: 'hf:FOLDER' there vs 'byte' here"); nothing left to train, then one epoch more
    assert main(["train", "--preset", "llama-cpu", "--out", str(run), "--quiet", "--init-from", str(folder),
                 *data, *shape, "--resume"]) == 0
    assert main(["train", "--preset", "llama-cpu", "--out", str(run), "--quiet", "--init-from", str(folder),
                 *data, *shape, "--resume", "train.epochs=2"]) == 0
    assert json.loads((run / "summary.json").read_text())["epochs_run"] == 2
    folder.rename(tmp_path / "gone")  # resumed without its folder: one line naming it, not "another config"
    rc = main(["train", "--preset", "llama-cpu", "--out", str(run), "--quiet", "--init-from", str(folder),
               *data, *shape, "--resume", "train.epochs=3"])
    one_line_error(capsys, rc, f"train.init_from={folder} does not exist", "restore it")
    (tmp_path / "gone").rename(folder)
    capsys.readouterr()
    assert main(["eval", str(run), "--text", str(tmp_path / "t.txt"), "--block-size", "16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokenizer"] == f"hf:{folder}" and got["bytes"] == len(TEXT.encode("utf-8"))
    # exported for transformers, the run takes the folder's tokenizer along: the export scores alike, as it is
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "exp")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "exp"), "--text", str(tmp_path / "t.txt"), "--block-size", "16",
                 "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["tokenizer"] == f"hf:{tmp_path / 'exp'}" and exported["tokens"] == got["tokens"]
    assert abs(exported["loss"] - got["loss"]) < 1e-5 * got["loss"]
    assert tf.AutoTokenizer.from_pretrained(str(tmp_path / "exp"))(TEXT).input_ids == \
        tf.AutoTokenizer.from_pretrained(str(folder))(TEXT).input_ids
    rc = main(["train", "--preset", "llama-cpu", "--out", str(tmp_path / "r2"), "--quiet", "--init-from",
               str(folder), *data, *shape, "data.tokenizer=byte"])
    one_line_error(capsys, rc, f"the tokenizer (source hf:{folder}, run byte)", f"data.tokenizer=hf:{folder}")
    (tmp_path / "run.yaml").write_text("data:\n  tokenizer: byte\n")  # named in the YAML file: the same choice
    rc = main(["train", "--preset", "llama-cpu", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "r3"),
               "--quiet", "--init-from", str(folder), *data, *shape])
    one_line_error(capsys, rc, f"the tokenizer (source hf:{folder}, run byte)", f"data.tokenizer=hf:{folder}")


def test_a_folder_converted_from_hf_is_scored_with_the_tokenizer_it_keeps(tmp_path, capsys):
    """`iattn convert --to canonical` copies the folder's tokenizer files: the canonical folder is scored with
    them as it is, to the HF folder's NLL (canonicalization is exact up to float rounding)."""
    folder = str(hf_folder(tmp_path / "hf", "Llama"))
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    assert main(["convert", "--from", folder, "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
    scores = []
    for model in (folder, str(tmp_path / "c")):
        capsys.readouterr()
        assert main(["eval", model, "--text", str(tmp_path / "t.txt"), "--block-size", "16", "--json"]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    assert scores[1]["tokenizer"] == f"hf:{tmp_path / 'c'}" and scores[1]["tokens"] == scores[0]["tokens"]
    assert abs(scores[1]["loss"] - scores[0]["loss"]) < 1e-5 * scores[0]["loss"]
    assert scores[1]["bytes"] == scores[0]["bytes"] == len(TEXT.encode("utf-8"))
    # and a run started from it (train.init_from= as an override this time) trains on that tokenizer
    from helpers import write_corpus

    paths = write_corpus(tmp_path)
    assert main(["train", "--preset", "llama-cpu", "--out", str(tmp_path / "run"), "--quiet",
                 f"train.init_from={tmp_path / 'c'}", "model.attention=canonical", "data.dataset=text",
                 *(f"data.{s}={paths[s]}" for s in ("train", "valid", "test")), "data.train_tokens=0",
                 f"data.cache_dir={tmp_path / 'cache'}", "model.n_layer=2", "model.n_embd=32", "model.mlp_hidden=48",
                 "model.block_size=32", "model.tie_embeddings=false", "train.epochs=1", "optim.warmup_steps=0"]) == 0
    assert f"tokenizer: hf:{tmp_path / 'c'}" in (tmp_path / "run" / "config.yaml").read_text()


def test_a_gpt2_run_on_a_folder_tokenizer_exports_a_folder_read_with_that_tokenizer(tmp_path, capsys):
    """A GPT-2-family run trained on hf:FOLDER: its export holds that tokenizer.json and no data spec, and an HF
    GPT-2 folder was read with GPT-2's BPE whatever it held (a smaller vocabulary refused with a misleading line,
    a larger one scored with the wrong tokenizer). A GPT-2 folder of another vocabulary size than GPT-2's is read
    with the tokenizer saved in it: the export scores what the run scores."""
    from helpers import write_corpus

    folder = hf_folder(tmp_path / "src", "Qwen2")
    paths = write_corpus(tmp_path)
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    data = ["data.dataset=text", *(f"data.{s}={paths[s]}" for s in ("train", "valid", "test")),
            "data.train_tokens=0", f"data.cache_dir={tmp_path / 'c'}", f"data.tokenizer=hf:{folder}"]
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", "train.max_steps=3",
                 "train.final_test=false", *data]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "exp")]) == 0
    capsys.readouterr()
    scores = []
    for model in (run, tmp_path / "exp"):
        assert main(["eval", str(model), "--text", str(tmp_path / "t.txt"), "--block-size", "16", "--json"]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    assert scores[1]["tokenizer"] == f"hf:{tmp_path / 'exp'}" and scores[1]["tokens"] == scores[0]["tokens"]
    assert abs(scores[1]["loss"] - scores[0]["loss"]) < 1e-5 * scores[0]["loss"]


def test_a_gpt2_folder_converted_whole_keeps_its_tokenizer_and_outlives_its_source(tmp_path, capsys):
    """A GPT-2 folder with its own tokenizer.json converts whole (not streamed) and now copies the tokenizer files
    as a streamed conversion does: the canonical folder, and the standard one made of it, are scored with the
    tokenizer each keeps after the folder before it is gone (it recorded hf:/ABSOLUTE/SOURCE and failed with
    'holds no tokenizer.json'). A GPT-2 folder without one keeps GPT-2's BPE, as before."""
    import shutil

    folder = hf_folder(tmp_path / "hf", "GPT2")
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    scores = []
    for src, to, out in ((folder, "canonical", tmp_path / "c"), (tmp_path / "c", "standard", tmp_path / "s")):
        assert main(["convert", "--from", str(src), "--to", to, "--out", str(out)]) == 0
        assert "copied tokenizer.json, tokenizer_config.json, generation_config.json" in capsys.readouterr().out
        assert not (out / "iattention-data.json").exists()
    for model in (folder, tmp_path / "c", tmp_path / "s"):
        assert main(["eval", str(model), "--text", str(tmp_path / "t.txt"), "--block-size", "16", "--json"]) == 0
        scores.append(json.loads(capsys.readouterr().out))
        shutil.rmtree(model)  # the next one reads its own copy
    assert [s["tokenizer"] for s in scores] == [f"hf:{m}" for m in (folder, tmp_path / "c", tmp_path / "s")]
    assert scores[2]["tokens"] == scores[1]["tokens"] == scores[0]["tokens"]
    assert max(abs(s["loss"] - scores[0]["loss"]) for s in scores) < 1e-5 * scores[0]["loss"]
    bare = hf_folder(tmp_path / "bare", "GPT2", tokenizer=False)
    assert main(["convert", "--from", str(bare), "--to", "canonical", "--out", str(tmp_path / "bc")]) == 0
    assert json.loads((tmp_path / "bc" / "iattention-data.json").read_text())["tokenizer"] == "gpt2"
    assert not (tmp_path / "bc" / "tokenizer.json").exists()


def _run_on_folder_tokenizer(tmp_path, folder, *extra):
    from helpers import write_corpus

    paths = write_corpus(tmp_path)
    data = ["data.dataset=text", *(f"data.{s}={paths[s]}" for s in ("train", "valid", "test")),
            "data.train_tokens=0", f"data.cache_dir={tmp_path / 'c'}", f"data.tokenizer=hf:{folder}"]
    return main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet", "train.max_steps=3",
                 "train.final_test=false", *data, *extra])


def test_a_run_on_a_folder_tokenizer_keeps_a_checked_copy_and_outlives_the_folder(tmp_path, capsys):
    """A run on hf:FOLDER keeps a copy of FOLDER's tokenizer files (hf-tokenizer/, added_tokens.json too, which
    transformers reads), so eval, generate and convert --to hf of the run work, alike, once FOLDER has moved
    (before: 'holds no tokenizer.json'). The copy is written only after a resume's checks; a symlink named
    hf-tokenizer is never written through nor read. The copy is the run's tokenizer from its start: a resume never
    replaces it, and a FOLDER whose tokenizer files changed since is refused in one line naming them, whatever the
    token cache holds."""
    import shutil

    from iattention.data.tokenizers import HF_KEPT

    folder = hf_folder(tmp_path / "src", "Qwen2")
    size = len(tf.AutoTokenizer.from_pretrained(str(folder)))
    (folder / "added_tokens.json").write_text(json.dumps({"<zork>": size}))  # one more token, read by transformers
    (folder / "additional_chat_templates").mkdir()  # a named chat template (transformers 5 reads the folder)
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages[0]['content'] }}")
    templates = tf.AutoTokenizer.from_pretrained(str(folder)).chat_template
    assert "tool_use" in str(templates)
    text = tmp_path / "t.txt"
    text.write_text(TEXT + " <zork> " + TEXT, encoding="utf-8")
    assert _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}") == 0
    run, kept = tmp_path / "run", tmp_path / "run" / HF_KEPT
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        p.name for p in folder.iterdir() if p.suffix == ".json" and p.name != "generation_config.json"
        or p.name == "additional_chat_templates")
    assert (kept / "additional_chat_templates" / "tool_use.jinja").is_file()
    evaluate = ["eval", str(run), "--text", str(text), "--block-size", "16", "--json"]
    capsys.readouterr()
    assert main(evaluate) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["generate", str(run), "--prompt", "the cat <zork>", "--max-new-tokens", "5", "--temperature",
                 "0"]) == 0
    said = capsys.readouterr().out
    shutil.move(folder, tmp_path / "moved")
    assert main(evaluate) == 0
    assert json.loads(capsys.readouterr().out) == before
    assert main(["generate", str(run), "--prompt", "the cat <zork>", "--max-new-tokens", "5", "--temperature",
                 "0"]) == 0
    assert capsys.readouterr().out == said
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "exp")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "exp"), "--text", str(text), "--block-size", "16", "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["tokens"] == before["tokens"] and abs(exported["loss"] - before["loss"]) < 1e-5 * before["loss"]
    assert tf.AutoTokenizer.from_pretrained(str(tmp_path / "exp")).chat_template == templates
    # the export says its tokenizer's special-token ids (they were null: transformers' generate never stopped)
    config = json.loads((tmp_path / "exp" / "config.json").read_text())
    gen = json.loads((tmp_path / "exp" / "generation_config.json").read_text())
    eos = tf.AutoTokenizer.from_pretrained(str(tmp_path / "exp")).eos_token_id
    assert eos is not None and config["eos_token_id"] == gen["eos_token_id"] == eos
    card = (tmp_path / "exp" / "README.md").read_text()  # the run's tokenizer by its folder's name: no local path
    assert "| tokenizer | hf:src: " in card and str(tmp_path) not in card
    # a checkpoint of the run keeps the copy too (it recorded hf:FOLDER alone, and was unreadable once FOLDER had
    # moved), and is read, and exported, with it
    assert main(["convert", "--from", str(run), "--to", "canonical", "--out", str(tmp_path / "conv")]) == 0
    assert (tmp_path / "conv" / HF_KEPT / "tokenizer.json").is_file()
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "conv"), "--text", str(text), "--block-size", "16", "--json"]) == 0
    converted = json.loads(capsys.readouterr().out)
    assert converted["tokens"] == before["tokens"] and abs(converted["loss"] - before["loss"]) < 1e-5 * before["loss"]
    assert main(["convert", "--from", str(tmp_path / "conv"), "--to", "hf", "--out", str(tmp_path / "exp2")]) == 0
    assert tf.AutoTokenizer.from_pretrained(str(tmp_path / "exp2"))(TEXT).input_ids == \
        tf.AutoTokenizer.from_pretrained(str(tmp_path / "exp"))(TEXT).input_ids
    assert json.loads((tmp_path / "exp2" / "config.json").read_text())["eos_token_id"] == eos  # kept on the way
    shutil.move(tmp_path / "moved", folder)

    # the copy is the run's tokenizer, fixed when it started: a resume never replaces it, and one whose FOLDER now
    # reads otherwise (added_tokens.json: another token under the same id, as transformers reads it) is refused in
    # one line naming the file, with a warm token cache or a cold one (a warm one trained on, and eval then scored
    # the run with FOLDER's new tokenizer: 795 tokens instead of 547)
    added, kept_files = folder / "added_tokens.json", {p.name: p.read_bytes() for p in kept.iterdir() if p.is_file()}
    original = added.read_bytes()
    added.write_text(json.dumps({"<frob>": size}))
    capsys.readouterr()
    for cache in ("warm", "cold"):
        if cache == "cold":
            shutil.rmtree(tmp_path / "c")
        rc = _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}", "--resume",
                                      "train.max_steps=5")
        one_line_error(capsys, rc, "added_tokens.json", str(folder), "changed since the run", str(kept), "restore")
        assert {p.name: p.read_bytes() for p in kept.iterdir() if p.is_file()} == kept_files
    added.write_bytes(original)
    rc = _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}", "--resume", "train.max_steps=5",
                                  "model.n_layer=3")  # another model: refused, the copy as it was
    assert rc != 0 and {p.name: p.read_bytes() for p in kept.iterdir() if p.is_file()} == kept_files
    capsys.readouterr()
    assert _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}", "--resume",
                                    "train.max_steps=5") == 0
    assert {p.name: p.read_bytes() for p in kept.iterdir() if p.is_file()} == kept_files
    assert not [p for p in run.iterdir() if ".iattn-" in p.name]
    capsys.readouterr()
    assert main(evaluate) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == before["tokens"]

    # a symlink in its place: left as it is, its target untouched, never read as the run's tokenizer
    shutil.rmtree(kept)
    other = hf_folder(tmp_path / "other", "Llama")
    kept.symlink_to(other, target_is_directory=True)
    listing = sorted(p.name for p in other.iterdir())
    assert _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}", "--resume",
                                    "train.max_steps=7") == 0
    assert "keeps no copy of its tokenizer" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == listing and kept.is_symlink()
    assert main(evaluate) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == before["tokens"]

    # a real folder of that name holding anything else: not ours, so neither read nor replaced
    kept.unlink()
    shutil.copytree(other, kept, ignore=shutil.ignore_patterns("*.safetensors"))
    (kept / "NOTES.txt").write_text("mine")
    assert main(evaluate) == 0
    got = json.loads(capsys.readouterr().out)  # FOLDER's tokenizer, not the other one in there (Llama's)
    assert (got["tokens"], got["bytes"], got["tokenizer"]) == (before["tokens"], before["bytes"], f"hf:{folder}")
    assert _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}", "--resume",
                                    "train.max_steps=7") == 0  # finished: returns its summary
    assert "keeps no copy of its tokenizer" in capsys.readouterr().err and (kept / "NOTES.txt").exists()

    # a finished run without a copy (one trained before runs kept it) gets one from a --resume that has nothing
    # to train
    shutil.rmtree(kept)
    assert _run_on_folder_tokenizer(tmp_path, folder, f"model.vocab_size={size + 1}", "--resume",
                                    "train.max_steps=7") == 0
    assert (kept / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


def test_a_copy_that_does_not_read_as_the_tokenizer_is_not_kept(tmp_path, monkeypatch):
    """The copy is read back and compared before it is kept: with a file transformers reads left out of the
    copy (added_tokens.json), nothing is kept, nothing is left behind, and the reason is given."""
    from iattention.data import DataConfig
    from iattention.data import tokenizers as toks

    folder = hf_folder(tmp_path / "src", "Qwen2")
    size = len(tf.AutoTokenizer.from_pretrained(str(folder)))
    (folder / "added_tokens.json").write_text(json.dumps({"<zork>": size}))
    tok = toks.load_tokenizer(DataConfig(tokenizer=f"hf:{folder}"))
    (tmp_path / "run").mkdir()
    assert toks.keep_hf_tokenizer(tok, tmp_path / "run") is None
    assert toks.same_hf_tokenizer(toks.load_tokenizer(DataConfig(tokenizer=f"hf:{tmp_path / 'run' / toks.HF_KEPT}")),
                                  tok)
    monkeypatch.setattr(toks, "HF_TOKENIZER_FILES", tuple(n for n in toks.HF_TOKENIZER_FILES
                                                          if n != "added_tokens.json"))
    (tmp_path / "run2").mkdir()
    why = toks.keep_hf_tokenizer(tok, tmp_path / "run2")
    assert "does not read as the tokenizer the run uses" in why and not list((tmp_path / "run2").iterdir())
    # what is compared beyond identity and size: the pipeline (here a normalizer set in memory, files unchanged)
    monkeypatch.undo()  # every file counted again
    other = toks.load_tokenizer(DataConfig(tokenizer=f"hf:{folder}"))
    assert toks.same_hf_tokenizer(other, tok)
    other._impl.tok.backend_tokenizer.normalizer = __import__("tokenizers").normalizers.Lowercase()
    assert toks.tokenizer_identity(other) == toks.tokenizer_identity(tok) and other.vocab_size == tok.vocab_size
    assert not toks.same_hf_tokenizer(other, tok)


def test_a_sweep_from_a_folder_with_its_own_tokenizer_runs_again(tmp_path, capsys):
    """`iattn compare ... train.init_from=DIR` run again over its finished runs (or to resume a cut one) checks
    each against the config its child derives, the folder's tokenizer included (it was refused: "holds a finished
    run with another config (data.tokenizer: 'hf:DIR' there vs 'byte' here)")."""
    from helpers import write_corpus

    folder = hf_folder(tmp_path / "src", "Llama")
    paths = write_corpus(tmp_path)
    argv = ["compare", "--preset", "tiny", "--heads", "4", f"train.init_from={folder}", "model.family=llama",
            "model.n_layer=2", "model.n_kv_head=2", "model.n_embd=32", "model.mlp_hidden=48", "model.block_size=32",
            "model.tie_embeddings=false", "train.max_steps=2", "train.final_test=false", "data.dataset=text",
            *(f"data.{s}={paths[s]}" for s in ("train", "valid", "test")), "data.train_tokens=0",
            f"data.cache_dir={tmp_path / 'c'}", "--out", str(tmp_path / "cmp")]
    assert main(argv) == 0
    assert f"tokenizer: hf:{folder}" in (tmp_path / "cmp" / "standard-h4-s0" / "config.yaml").read_text()
    assert main(argv) == 0


def test_a_checkpoint_of_a_run_whose_folder_tokenizer_changed_converts_without_a_copy(tmp_path, capsys):
    """A run without a kept copy (trained before runs kept one) whose FOLDER's tokenizer has changed since: its
    conversion to canonical still writes the weights, as before, with a warning and no copy of the changed
    tokenizer (the copy is only for reading it later; refusing the conversion named a --tokenizer flag convert
    does not have)."""
    import shutil

    from iattention.data.tokenizers import HF_KEPT

    folder = hf_folder(tmp_path / "src", "Qwen2")
    assert _run_on_folder_tokenizer(tmp_path, folder) == 0
    shutil.rmtree(tmp_path / "run" / HF_KEPT)
    config = json.loads((folder / "tokenizer.json").read_text())
    config["normalizer"] = {"type": "Lowercase"}
    (folder / "tokenizer.json").write_text(json.dumps(config))
    capsys.readouterr()
    out = tmp_path / "conv"
    assert main(["convert", "--from", str(tmp_path / "run"), "--to", "canonical", "--out", str(out)]) == 0
    assert "keeps no copy of its tokenizer" in capsys.readouterr().err
    assert not (out / HF_KEPT).exists() and (out / "model.safetensors").is_file()
