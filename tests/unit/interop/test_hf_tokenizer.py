"""A run's tokenizer exported for transformers (`interop/hf_tokenizer.py`): AutoTokenizer reads the folder
offline and gives our ids for any text, the end-of-text token is the first id past the vocabulary, the
length limit is the model's, and the files hold only what every transformers version reads."""

import json

import pytest

from fixtures import UNICODE, bpe_tokenizer, byte_tokenizer
from iattention.interop.hf_tokenizer import save_hf_tokenizer

tf = pytest.importorskip("transformers")

TEXT = "the cat sat on the mat .\n" + UNICODE


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_transformers_reads_the_export_as_our_tokenizer(tmp_path, kind):
    ours = byte_tokenizer() if kind == "byte" else bpe_tokenizer(tmp_path)
    out = tmp_path / "export"
    eos = save_hf_tokenizer(ours, out, model_max_length=24)
    theirs = tf.AutoTokenizer.from_pretrained(str(out))
    assert theirs.encode(TEXT) == [int(i) for i in ours.encode(TEXT)]
    assert theirs.decode(theirs.encode(TEXT)) == TEXT
    assert eos == ours.vocab_size and theirs.eos_token_id == theirs.bos_token_id == eos
    assert theirs.model_max_length == 24
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert set(config) <= {"bos_token", "eos_token", "unk_token", "model_max_length", "tokenizer_class",
                           "clean_up_tokenization_spaces"}


def test_bpe_merges_are_written_as_strings_every_tokenizers_version_reads(tmp_path):
    save_hf_tokenizer(bpe_tokenizer(tmp_path), tmp_path / "export")
    merges = json.loads((tmp_path / "export" / "tokenizer.json").read_text())["model"]["merges"]
    assert merges and all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges)
