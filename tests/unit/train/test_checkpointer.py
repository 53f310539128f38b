"""Unit tests of iattention.train.checkpointer."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention.checkpoint.run_folder import CONFIG, METRICS, STEPS, SUMMARY, RunFolder
from iattention.errors import UserError
from iattention.model.gpt import GPT
from iattention.train import load_config
from iattention.train.checkpointer import Checkpointer
from iattention.train.corpus import load_run_data
from iattention.train.distributed import DistContext
from iattention.train.optim import build_optimizer
from iattention.train.state import TrainState
from iattention.train.trainer import _config_dict


@pytest.fixture
def run(tmp_path):
    """A tiny run's resolved config and data (no model trained)."""
    paths = write_corpus(tmp_path, n_train=1200, n_eval=300)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"model.n_layer": 1, "model.n_embd": 16, "model.n_head": 2,
                                                      "model.block_size": 16, "train.batch_size": 4})
    cfg, data = load_run_data(load_config("tiny", None, ov), world=1)
    return cfg, data


def _config(cfg, **train) -> dict:
    c = _config_dict(cfg)
    c["train"].update(train)
    return c


def _parts(cfg, data, folder, config: dict, resume: bool):
    """A checkpointer that has checked `folder` for `config`, and a model and optimizer to start."""
    ck = Checkpointer(folder, resume, DistContext())
    finished = ck.check(config, data.fingerprints, data.tokenizer)
    model = GPT(cfg.model)
    return ck, finished, model, build_optimizer(model, cfg.optim, "cpu")


def _leave_a_run(cfg, data, folder, epochs_done: int, summary_epochs: int | None = None):
    """What a run of `cfg` leaves after `epochs_done` epochs (one step each): config, logs, last checkpoint,
    and a summary of `summary_epochs` epochs if given. Returns its model."""
    ck, _, model, opt = _parts(cfg, data, folder, _config_dict(cfg), resume=False)
    assert ck.start(model, opt).resumed is False  # a fresh run: config.yaml written now
    state = TrainState(step=epochs_done, epoch=epochs_done, best_val_loss=3.0, best_epoch=1, stopped_early=True)
    RunFolder(folder).write_records(STEPS, [dict(step=e, loss=3.0, lr=1e-3, grad_norm=1.0)
                                            for e in range(1, epochs_done + 1)])
    RunFolder(folder).write_records(METRICS, [dict(kind="epoch", step=e, epoch=e, val_ppl=20.0)
                                              for e in range(1, epochs_done + 1)])
    ck.save_last(model, opt, state)
    if summary_epochs is not None:
        RunFolder(folder).write_summary(dict(config=_config_dict(cfg), attention="standard", n_head=2, seed=0,
                                             best_val_ppl=20.0, best_epoch=1, epochs_run=summary_epochs))
    return model


def test_resume_policy_new_finished_extended_and_refused(run, tmp_path, capsys):
    cfg, data = run
    folder = tmp_path / "r"
    trained = _leave_a_run(cfg, data, folder, epochs_done=2, summary_epochs=2)
    assert (folder / CONFIG).exists()
    # without --resume: a folder that holds a run is refused
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        _parts(cfg, data, folder, _config_dict(cfg), resume=False)
    # --resume with the same epochs: the finished run's summary, nothing to train
    ck, finished, _, _ = _parts(cfg, data, folder, _config_dict(cfg), resume=True)
    assert finished is not None and finished["epochs_run"] == 2 and ck.extending is False
    # another config (not only more epochs): refused
    with pytest.raises(UserError, match="holds a run with another config"):
        _parts(cfg, data, folder, _config(cfg, seed=5), resume=True)
    # more epochs: an extension; it resumes last.safetensors, rewrites config.yaml and drops the summary
    longer = _config(cfg, epochs=4)
    ck, finished, model, opt = _parts(cfg, data, folder, longer, resume=True)
    assert finished is None and ck.extending is True
    start = ck.start(model, opt)
    assert start.resumed and start.state.step == 2 and start.state.stopped_early is False
    assert [r["step"] for r in start.steps] == [1, 2] and len(start.records) == 2
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    assert not (folder / SUMMARY).exists() and RunFolder(folder).read_config()["train"]["epochs"] == 4
    assert "extending" in capsys.readouterr().err


def test_a_shorter_summary_is_an_extension_that_died(run, tmp_path):
    """config.yaml says 4 epochs, the summary 2: an extension died between rewriting the config and
    dropping the summary; --resume with 4 epochs goes on extending (from last.safetensors' 2 epochs)."""
    cfg, data = run
    folder = tmp_path / "r"
    _leave_a_run(cfg, data, folder, epochs_done=2, summary_epochs=2)
    RunFolder(folder).write_config(_config(cfg, epochs=4))
    ck, finished, model, opt = _parts(cfg, data, folder, _config(cfg, epochs=4), resume=True)
    assert finished is None and ck.extending is True
    assert ck.start(model, opt).state.epoch == 2 and not (folder / SUMMARY).exists()


def test_resume_refuses_other_data_and_a_log_with_a_gap(run, tmp_path):
    cfg, data = run
    folder = tmp_path / "r"
    _leave_a_run(cfg, data, folder, epochs_done=2)
    ck, _, model, opt = _parts(cfg, data, folder, _config_dict(cfg), resume=True)
    ck.fingerprints = dict(data.fingerprints, train="0" * 64)
    with pytest.raises(UserError, match="trained on other train data"):
        ck.start(model, opt)
    lines = (folder / STEPS).read_text().splitlines()
    (folder / STEPS).write_text(lines[0] + "\n")  # step 2 lost
    ck, _, model, opt = _parts(cfg, data, folder, _config_dict(cfg), resume=True)
    with pytest.raises(UserError, match=r"steps.jsonl is corrupt \(holds 1 records where the checkpoint has run 2"):
        ck.start(model, opt)


def test_resume_without_a_checkpoint_starts_fresh(run, tmp_path, capsys):
    cfg, data = run
    folder = tmp_path / "r"
    folder.mkdir()
    ck, finished, model, opt = _parts(cfg, data, folder, _config_dict(cfg), resume=True)
    start = ck.start(model, opt)
    assert finished is None and start.resumed is False and start.state == TrainState() and start.records == []
    assert "holds no checkpoint to resume; starting a fresh run there" in capsys.readouterr().err
    assert RunFolder(folder).read_config() == _config_dict(cfg)


@pytest.mark.parametrize("name, content", [
    ("added_tokens.json", None),  # another token under the same id: transformers reads it, the three files hashed
    ("chat_template.jinja", "{{ messages[0]['content'] }}!"),  # before did not see it
    ("additional_chat_templates/tool_use.jinja", "{{ messages }}"),
    ("tokenizer_config.json", None)])
def test_a_resume_on_a_folder_whose_tokenizer_changed_is_refused_and_the_copy_never_replaced(tmp_path, name, content):
    """A run on hf:FOLDER keeps the tokenizer it started with (hf-tokenizer/). Its identity (and token cache key)
    covers every file AutoTokenizer reads, and a resume whose FOLDER now holds another one is refused in one line
    naming the file, before anything in the run changes: the copy is never replaced (every --resume replaced it
    with FOLDER's files, and eval then scored the run with a tokenizer it never trained on)."""
    import json

    pytest.importorskip("transformers")
    from fixtures import hf_folder
    from helpers import tells
    from iattention.data import DataConfig
    from iattention.data.tokenizers import HF_KEPT, keep_hf_tokenizer, load_tokenizer, tokenizer_identity

    folder = hf_folder(tmp_path / "src", "Qwen2")
    (folder / "added_tokens.json").write_text(json.dumps({"<zork>": 300}))
    tok = load_tokenizer(DataConfig(tokenizer=f"hf:{folder}"))
    run = tmp_path / "run"
    run.mkdir()
    assert keep_hf_tokenizer(tok, run) is None
    kept = {p.relative_to(run): p.read_bytes() for p in (run / HF_KEPT).rglob("*") if p.is_file()}
    resumed = Checkpointer(run, resume=True, ctx=DistContext())
    resumed._tokenizer = tok
    resumed._check_folder_tokenizer()  # FOLDER as the run started: goes on
    path = folder / name
    path.parent.mkdir(exist_ok=True)
    if name == "added_tokens.json":
        content = json.dumps({"<frob>": 300})
    elif name == "tokenizer_config.json":
        content = json.dumps({**json.loads(path.read_text()), "chat_template": "{{ 'x' }}"})
    path.write_text(content)
    now = load_tokenizer(DataConfig(tokenizer=f"hf:{folder}"))
    assert tokenizer_identity(now) != tokenizer_identity(tok) and now.fingerprint != tok.fingerprint
    resumed._tokenizer = now
    with pytest.raises(UserError) as err:
        resumed._check_folder_tokenizer()
    tells(err, name, str(folder), "changed since the run", str(run / HF_KEPT), "restore", "another --out")
    assert keep_hf_tokenizer(now, run) is None  # never replaced
    assert {p.relative_to(run): p.read_bytes() for p in (run / HF_KEPT).rglob("*") if p.is_file()} == kept
