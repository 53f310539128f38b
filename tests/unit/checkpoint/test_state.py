"""Unit tests of iattention.checkpoint.state."""

import dataclasses
import json
import os
import resource
import signal
import struct
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from helpers import make_model, tells
from iattention.checkpoint import state as ckpt
from iattention.errors import UserError
from iattention.train.state import TrainState
from iattention.utils.atomic import temp_writer


def test_checkpoint_metadata_that_is_not_ours_is_refused(tmp_path):
    model = make_model(dtype=torch.float32)
    path = tmp_path / "x.safetensors"
    for meta in ("not json", "[1]", json.dumps({"format": "other"})):
        save_file(ckpt.model_tensors(model), str(path), metadata={"iattention": meta})
        with pytest.raises(UserError, match="x.safetensors"):
            ckpt.read_meta(path)
    path.write_bytes(b"\x80\x04pickle behind a safetensors name")
    with pytest.raises(UserError, match="corrupt or truncated"):
        ckpt.read_meta(path)


def _header_only_file(path, meta: dict, n_floats: int) -> None:
    """A safetensors file whose header declares one F32 tensor of `n_floats` over a sparse file (holes)."""

    header = json.dumps({"__metadata__": {"iattention": json.dumps(meta)}, "model/x": {
        "dtype": "F32", "shape": [n_floats], "data_offsets": [0, n_floats * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n_floats * 4)


def test_declared_size_against_the_bytes_held_and_free_memory(tmp_path, monkeypatch):
    model = make_model(dtype=torch.float32)
    good = tmp_path / "good.safetensors"
    ckpt.save_checkpoint(good, model, {"config": {}})
    ckpt.check_declared_size(good)  # a real file holds what it declares
    sparse = tmp_path / "sparse.safetensors"
    _header_only_file(sparse, {"format": ckpt.FORMAT}, 16 * 2**20)  # 64 MiB declared, a few KiB held
    if sparse.stat().st_blocks * 512 > 2**20:
        pytest.skip("this file system does not make sparse files")
    with pytest.raises(UserError, match=r"declares 0\.0625 GiB of tensors but holds .* \(a sparse or crafted file\)"):
        ckpt.check_declared_size(sparse)
    monkeypatch.setattr(ckpt, "available_memory", lambda: 1000)
    with pytest.raises(UserError, match=r"declares .* GiB of tensors, more than the .* GiB this machine has free"):
        ckpt.check_declared_size(good)
    monkeypatch.setattr(ckpt, "available_memory", lambda: None)  # unknown: not refused on memory
    ckpt.check_declared_size(good)


def test_metadata_types_an_int_for_a_float_key_reads_and_a_wrong_type_is_named(tmp_path):
    model = make_model(dtype=torch.float32)
    path = tmp_path / "m.safetensors"
    cfg = dict(n_layer=2, n_head=3, n_embd=48, vocab_size=97, block_size=16)
    ckpt.save_checkpoint(path, model, {"config": {"model": dict(cfg, dropout=0)}, "state": {"step": 3}})
    assert ckpt.read_meta(path)["config"]["model"]["dropout"] == 0  # JSON writes 0.0 as 0 in other tools
    for bad, key in ((dict(cfg, bias=1), "config.model.bias"), (dict(cfg, n_layer=2.0), "config.model.n_layer"),
                     (dict(cfg, wat=1), "config.model.wat")):
        ckpt.save_checkpoint(path, model, {"config": {"model": bad}})
        with pytest.raises(UserError, match=rf"m\.safetensors has bad metadata \({key}: "):
            ckpt.read_meta(path)


def test_read_state_names_the_file_and_the_key():
    assert ckpt.read_state("r.safetensors", {"state": {"step": 3, "epoch": 1}}, TrainState).step == 3
    with pytest.raises(UserError, match=r"checkpoint r\.safetensors has bad metadata \(state\.wat: not a key"):
        ckpt.read_state("r.safetensors", {"state": {"wat": 1}}, TrainState)
    with pytest.raises(UserError, match=r"checkpoint r\.safetensors has bad metadata \(state\.step: str"):
        ckpt.read_state("r.safetensors", {"state": {"step": "3"}}, TrainState)
    with pytest.raises(UserError, match=r"\(state: missing\)"):
        ckpt.read_state("r.safetensors", {}, TrainState)


def test_optimizer_state_round_trips_and_a_missing_tensor_is_named(tmp_path):
    model = make_model(dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    opt.step()
    path = tmp_path / "o.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": 1}}, optimizer=opt)
    meta, tensors = ckpt.read_meta(path), ckpt.load_tensors(path)
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt.load_optimizer_state(fresh, tensors, meta, path)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    first = sorted(k for k in tensors if k.startswith("optim/"))[0]
    with pytest.raises(UserError, match=rf"lacks 1 of its \d+ optimizer tensors \(e\.g\. {first}\)"):
        ckpt.load_optimizer_state(fresh, {k: v for k, v in tensors.items() if k != first}, meta, path)
    with pytest.raises(UserError, match=r"\(optimizer: missing: the checkpoint holds no optimizer state to resume\)"):
        ckpt.load_optimizer_state(fresh, tensors, {k: v for k, v in meta.items() if k != "optimizer"}, path)


def test_read_meta_reads_an_old_key_under_its_new_name_and_checks_state_types(tmp_path):
    model = make_model(dtype=torch.float32)
    path = tmp_path / "old.safetensors"
    old = {"attention": "canonical", "canonical": "vo", "n_layer": 2, "n_head": 3, "n_embd": 48, "vocab_size": 97,
           "block_size": 16}
    ckpt.save_checkpoint(path, model, {"config": {"model": old}})
    model_cfg = ckpt.read_meta(path)["config"]["model"]
    assert model_cfg["canonical_halves"] == "vo" and "canonical" not in model_cfg
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": "3"}})
    with pytest.raises(UserError, match=r"\(state\.step: str '3', expected a number\)"):
        ckpt.read_meta(path)
    ckpt.save_checkpoint(path, model, {"config": {"model": dict(old, n_head=5)}})  # 48 is not a multiple of 5
    with pytest.raises(UserError, match=r"\(config\.model: .*n_head"):
        ckpt.read_meta(path)


def test_check_finite_names_the_kind_of_bad_value():
    good = {"w": torch.ones(3)}
    ckpt.check_finite(good, "x", "fix it")
    for value, kinds in ((float("nan"), "NaN"), (float("inf"), "Inf")):
        with pytest.raises(UserError, match=rf"^x holds non-finite weights \(1 {kinds} value\(s\) in w\); fix it$"):
            ckpt.check_finite({"w": torch.tensor([1.0, value])}, "x", "fix it")
    with pytest.raises(UserError, match=r"\(2 NaN/Inf value\(s\) in w\)"):
        ckpt.check_finite({"w": torch.tensor([float("nan"), float("-inf")])}, "x", "fix it")


def test_a_bad_rng_state_and_an_old_checkpoint_without_moments_are_named(tmp_path):
    model = make_model(dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meta = {"optimizer": {"param_groups": opt.state_dict()["param_groups"]}}
    with pytest.raises(UserError, match=r"\(tensor rng/torch: float32 of shape \[3\], expected a 1-D uint8 RNG"):
        ckpt.load_optimizer_state(opt, {"rng/torch": torch.zeros(3)}, meta, "r.safetensors")
    with pytest.raises(UserError, match=r"\(tensor rng/torch: .+\)"):
        ckpt.load_optimizer_state(opt, {"rng/torch": torch.zeros(3, dtype=torch.uint8)}, meta, "r.safetensors")
    old = dict(meta, state={"step": 4, "skipped": 1})  # written before the tensors were listed
    with pytest.raises(UserError, match=r"has run 3 optimizer step\(s\) but holds no optimizer tensors"):
        ckpt.load_optimizer_state(opt, {}, old, "r.safetensors")
    ckpt.load_optimizer_state(opt, {}, dict(meta, state={"step": 2, "skipped": 2}), "r.safetensors")  # none applied


FILE_C = "checkpoint c.safetensors"
_FIX = "; resume from another checkpoint (a run's last or best) or retrain"


@pytest.mark.parametrize("meta,problem", [
    ({"config": [1]}, "config: list [1], expected an object"),
    ({"config": {"model": {"wat": 1}}}, "config.model.wat: not a model key"),
    ({"config": {"model": {"n_layer": "2"}}}, "config.model.n_layer: str '2', expected int"),
    ({"state": [1]}, "state: list [1], expected an object"),
    ({"optimizer": {"param_groups": [{"params": ["a"]}]}},
     "optimizer.param_groups: expected a list of objects with integer 'params'"),
    ({"optimizer": {"param_groups": [{"params": 5}]}},
     "optimizer.param_groups: expected a list of objects with integer 'params'"),
])
def test_bad_metadata_names_the_file_the_key_and_the_fix(meta, problem):
    with pytest.raises(UserError) as err:
        ckpt._check_meta(Path("c.safetensors"), meta)
    tells(err, FILE_C, problem, _FIX[2:])


def test_read_state_lists_the_keys_and_takes_an_int_for_a_float():
    assert ckpt.read_state("r.safetensors", {"state": {"best_val_loss": 5}}, TrainState).best_val_loss == 5
    keys = ", ".join(f.name for f in dataclasses.fields(TrainState))
    with pytest.raises(UserError) as err:
        ckpt.read_state("r.safetensors", {"state": {"wat": 1}}, TrainState)
    tells(err, "r.safetensors", "state.wat", keys)


def test_declared_size_sums_every_tensor(tmp_path, monkeypatch):
    model = make_model(dtype=torch.float32)
    path = tmp_path / "m.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {}})
    with safe_open(str(path), framework="pt") as f:
        total = sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
    monkeypatch.setattr(ckpt, "available_memory", lambda: total)
    ckpt.check_declared_size(path)  # exactly fits
    monkeypatch.setattr(ckpt, "available_memory", lambda: total - 1)
    with pytest.raises(UserError, match="more than the"):
        ckpt.check_declared_size(path)


def test_saving_the_optimizer_state_warns_nothing(tmp_path):
    model = make_model(dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch.tensor(a_tensor)'s copy-construct warning
        ckpt.save_checkpoint(tmp_path / "o.safetensors", model, {"config": {}}, optimizer=opt)


def _trained(steps: int = 1):
    """A model and its AdamW after `steps` steps."""
    model = make_model(dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
        opt.step()
    return model, opt


def test_read_meta_of_a_foreign_safetensors_file_and_of_another_format(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(UserError) as err:
        ckpt.read_meta(path)
    tells(err, str(path), "not an iattention checkpoint", "iattn convert")
    save_file({"w": torch.zeros(2)}, str(path), metadata={"iattention": json.dumps({"format": "other"})})
    with pytest.raises(UserError) as err:
        ckpt.read_meta(path)
    tells(err, str(path), "'other'", ckpt.FORMAT)


@pytest.mark.parametrize("meta,problem", [
    ({"config": {"train": 3}}, "config.train: int 3, expected an object"),
    # a long value is cut to 60 characters: "str '" and 55 of its 100
    ({"config": {"model": {"block_size": "x" * 100}}}, "config.model.block_size: str '" + "x" * 55 + ", expected int"),
], ids=["section", "long-value"])
def test_more_bad_metadata_names_the_file_the_key_and_the_fix(meta, problem):
    with pytest.raises(UserError) as err:
        ckpt._check_meta(Path("c.safetensors"), meta)
    tells(err, FILE_C, problem, _FIX[2:])


def test_read_state_without_a_state_and_with_a_float_for_an_int():
    for meta, problem in (({}, "state: missing"), ({"state": {"step": 1.5}}, "state.step: float 1.5, expected int")):
        with pytest.raises(UserError) as err:
            ckpt.read_state("r.safetensors", meta, TrainState)
        tells(err, "r.safetensors", problem, _FIX[2:])


def test_a_sparse_file_names_what_it_declares_and_what_it_holds(tmp_path):
    sparse = tmp_path / "sparse.safetensors"
    _header_only_file(sparse, {"format": ckpt.FORMAT}, 16 * 2**20)
    if sparse.stat().st_blocks * 512 > 2**20:
        pytest.skip("this file system does not make sparse files")
    held = sparse.stat().st_blocks * 512
    with pytest.raises(UserError) as err:
        ckpt.check_declared_size(sparse)
    tells(err, str(sparse), "0.0625 GiB", f"{held / 2**30:.3g} GiB", "intact checkpoint")


def test_a_resume_restores_the_rng_saved_with_the_optimizer(tmp_path):
    model, opt = _trained()
    path = tmp_path / "o.safetensors"
    torch.manual_seed(123)
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": 1}}, optimizer=opt)
    after_save = torch.rand(4)
    torch.manual_seed(999)
    ckpt.load_optimizer_state(opt, ckpt.load_tensors(path), ckpt.read_meta(path), path)
    assert torch.equal(torch.rand(4), after_save)


def test_an_incomplete_optimizer_state_names_what_is_missing_and_the_fix(tmp_path):
    listed = {"optimizer": {"tensors": ["optim/0/exp_avg", "optim/0/exp_avg_sq"]}}
    with pytest.raises(UserError) as err:
        ckpt._check_optimizer_complete({"optim/0/exp_avg": 1}, {0: {}}, listed, "p.safetensors")
    tells(err, "p.safetensors", "1 of its 2", "optim/0/exp_avg_sq", "optimizer's moments", "complete checkpoint")
    one_step = {"step": 1}
    for meta in ({"state": one_step}, {"state": dict(one_step, skipped=0)}, {"optimizer": None, "state": one_step}):
        with pytest.raises(UserError) as err:  # an older checkpoint (no list), one step applied, no moments
            ckpt._check_optimizer_complete({}, {}, meta, "p.safetensors")
        tells(err, "p.safetensors", "1 optimizer step", "no optimizer tensors", "complete checkpoint")
    ckpt._check_optimizer_complete({}, {}, {"state": {"step": 0}}, "p.safetensors")


def test_an_older_checkpoint_with_its_moments_resumes(tmp_path):
    model, opt = _trained()
    path = tmp_path / "o.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": 1}}, optimizer=opt)
    meta, tensors = ckpt.read_meta(path), ckpt.load_tensors(path)
    del meta["optimizer"]["tensors"]  # written before the tensors were listed
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt.load_optimizer_state(fresh, tensors, meta, path)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_weights_that_cannot_load_name_the_tensor_and_the_fix(tmp_path):
    model = make_model(dtype=torch.float32)
    tensors = ckpt.model_tensors(model)
    bad = dict(tensors, **{"model/transformer.wpe.weight": torch.full_like(tensors["model/transformer.wpe.weight"],
                                                                           float("nan"))})
    n = bad["model/transformer.wpe.weight"].numel()
    with pytest.raises(UserError) as err:
        ckpt.load_model_state(model, bad, "c.safetensors")
    tells(err, FILE_C, "non-finite", f"{n} NaN", "transformer.wpe.weight", "another checkpoint or retrain")
    wide = dict(tensors, **{"model/transformer.wpe.weight": tensors["model/transformer.wpe.weight"].double()})
    with pytest.raises(UserError) as err:
        ckpt.load_model_state(model, wide, "c.safetensors")
    tells(err, FILE_C, "transformer.wpe.weight", "float64", "float32", "iattn convert --dtype")


def test_load_model_state_refuses_missing_weights_naming_them(tmp_path):
    model = make_model(dtype=torch.float32)
    tensors = ckpt.model_tensors(model)
    dropped = [k for k in tensors if k.startswith("model/transformer.h.0.")]
    partial = {k: v for k, v in tensors.items() if k not in dropped}
    try:  # what torch says of the same state dict, for the part of our message that quotes it
        state = {k[len("model/"):]: v for k, v in partial.items()}
        make_model(dtype=torch.float32).load_state_dict({**state, "lm_head.weight": state["transformer.wte.weight"]})
    except RuntimeError as e:
        quoted = str(e).splitlines()[1].strip()
    assert len(quoted) > 100
    with pytest.raises(UserError) as err:
        ckpt.load_model_state(model, partial, "c.safetensors")
    tells(err, FILE_C, "does not fit this model", quoted[:100], "the config the checkpoint was trained with")
    no_embedding = {k: v for k, v in tensors.items() if k != "model/transformer.wte.weight"}
    with pytest.raises(UserError, match=r"^checkpoint c\.safetensors does not fit this model \("):
        ckpt.load_model_state(model, no_embedding, "c.safetensors")


def test_optimizer_state_that_cannot_load_names_the_tensor_and_the_fix(tmp_path):
    model, opt = _trained()
    groups = opt.state_dict()["param_groups"]
    n = sum(len(g["params"]) for g in groups)
    meta = {"optimizer": {"param_groups": groups}}
    fix = "; resume from another checkpoint (a run's last or best) or retrain"
    with pytest.raises(UserError) as err:
        ckpt.load_optimizer_state(opt, {}, {})
    tells(err, "(unnamed)", "optimizer", "no optimizer state", fix[2:])
    for name in ("optim/x/exp_avg", f"optim/{n}/exp_avg"):
        with pytest.raises(UserError) as err:
            ckpt.load_optimizer_state(opt, {name: torch.zeros(1)}, meta, "o.safetensors")
        tells(err, "o.safetensors", name, f"parameter index < {n}", fix[2:])
    one = [dict(groups[0], params=[0])]
    try:  # torch's own words for the same mismatch, which our message quotes
        torch.optim.AdamW(model.parameters(), lr=1e-3).load_state_dict({"state": {}, "param_groups": one})
    except ValueError as e:
        quoted = str(e).splitlines()[0]
    assert len(quoted) > 80
    with pytest.raises(UserError) as err:
        ckpt.load_optimizer_state(opt, {}, {"optimizer": {"param_groups": one}}, "o.safetensors")
    # quoted up to the last whole word within 80 characters, never cut inside one
    tells(err, "o.safetensors", "does not fit this model's optimizer", quoted[:80].rsplit(" ", 1)[0] + " ...",
          fix[2:])
    rng = torch.zeros(3, dtype=torch.uint8)
    try:
        torch.set_rng_state(rng)
    except RuntimeError as e:
        quoted = str(e).splitlines()[0]
    assert len(quoted) > 80
    with pytest.raises(UserError) as err:
        ckpt.load_optimizer_state(opt, {"rng/torch": rng}, meta, "o.safetensors")
    tells(err, "o.safetensors", "rng/torch", quoted[:80].rsplit(" ", 1)[0] + " ...", fix[2:])
    with pytest.raises(UserError) as err:
        ckpt.load_optimizer_state(opt, {"rng/torch": torch.zeros(2, 2)}, meta, "o.safetensors")
    tells(err, "o.safetensors", "rng/torch", "float32", "[2, 2]", "1-D uint8", fix[2:])


def test_an_optimizer_state_that_holds_a_plain_number_is_saved_as_a_tensor(tmp_path):
    class PlainSGD(torch.optim.Optimizer):
        """SGD counting its steps in a Python int, as torch < 1.12's Adam kept `step`."""

        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["step"] = self.state[p].get("step", 0) + 1
                    p.add_(p.grad, alpha=-group["lr"])

    model = make_model(dtype=torch.float32)
    opt = PlainSGD(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    opt.step()
    opt.step()
    path = tmp_path / "o.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": 2}}, optimizer=opt)
    tensors = ckpt.load_tensors(path)
    steps = {k: v for k, v in tensors.items() if k.startswith("optim/")}
    n = len(list(model.parameters()))
    assert sorted(steps) == sorted(f"optim/{i}/step" for i in range(n))
    assert all(v.dtype == torch.int64 and v.dim() == 0 and int(v) == 2 for v in steps.values())


def test_a_checkpoint_write_past_the_file_size_limit_is_one_line_and_leaves_nothing(tmp_path):
    """`ulimit -f` (or FAT32's 4 GiB): safetensors raises SafetensorError('... (os error 27)'), EFBIG; the user
    gets one line naming the checkpoint (not the temp file, which is gone), and no file is left."""

    model = make_model(dtype=torch.float32)
    path = tmp_path / "c.safetensors"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # writing past it is EFBIG (Python ignores SIGXFSZ)
    try:
        with pytest.raises(UserError) as err:
            ckpt.save_checkpoint(path, model, {"config": {}})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    tells(err, str(path), "file too large", "ulimit -f")
    assert list(tmp_path.iterdir()) == []  # the temp file is removed, nothing is written


def test_the_ckpt_write_failpoint_tears_the_temp_file_in_half_and_kills(tmp_path):
    """IATTN_FAULT=ckpt_write:1 (the crash tests' hook): the process dies by SIGKILL after the temp file is
    written, leaving half of it, and the checkpoint itself is not there."""


    model = make_model(dtype=torch.float32)
    ckpt.save_checkpoint(tmp_path / "whole" / "c.safetensors", model, {"config": {}})
    size = (tmp_path / "whole" / "c.safetensors").stat().st_size
    path = tmp_path / "torn" / "c.safetensors"
    pid = os.fork()
    if pid == 0:  # the child: only the fault (or os._exit) ends it, never pytest
        code = 1
        try:
            os.environ["IATTN_FAULT"] = "ckpt_write:1"
            ckpt.save_checkpoint(path, model, {"config": {}})
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    left = list(path.parent.iterdir())
    assert [temp_writer(p.name) for p in left] == [pid]
    assert left[0].stat().st_size == size // 2 and not path.exists()


def test_metadata_that_is_not_a_json_object_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "x.safetensors"
    for raw in ("not json", "[1]"):
        save_file({"w": torch.zeros(2)}, str(path), metadata={"iattention": raw})
        with pytest.raises(UserError) as err:
            ckpt.read_meta(path)
        tells(err, str(path), "not a JSON object", "another checkpoint or retrain")


@pytest.mark.parametrize("meta,problem", [
    ({"state": {"step": "3"}}, "state.step: str '3', expected a number"),
    ({"optimizer": [1]}, "optimizer.param_groups: expected a list of objects with integer 'params'"),
    ({"optimizer": {"param_groups": 5}}, "optimizer.param_groups: expected a list of objects with integer 'params'"),
    ({"optimizer": {"param_groups": []}}, "optimizer.param_groups: expected a list of objects with integer 'params'"),
], ids=["state-type", "optimizer-list", "groups-int", "groups-empty"])
def test_bad_state_and_optimizer_metadata_names_the_key(meta, problem):
    with pytest.raises(UserError) as err:
        ckpt._check_meta(Path("c.safetensors"), meta)
    tells(err, FILE_C, problem, _FIX[2:])


def test_a_model_config_the_model_refuses_names_the_file_and_the_fix():
    model = dict(n_layer=2, n_head=5, n_embd=48, vocab_size=97, block_size=16)
    with pytest.raises(UserError) as err:
        ckpt._check_meta(Path("c.safetensors"), {"config": {"model": model}})
    tells(err, FILE_C, "config.model", "n_embd=48", "n_head=5", "divides 48", _FIX[2:])


def test_declared_size_counts_8_bytes_for_a_dtype_it_does_not_know(tmp_path, monkeypatch):
    path = tmp_path / "f8.safetensors"
    save_file({"model/x": torch.zeros(16, dtype=torch.float8_e4m3fn)}, str(path))  # F8_E4M3: 1 byte, counted 8
    monkeypatch.setattr(ckpt, "available_memory", lambda: 16 * 8)
    ckpt.check_declared_size(path)
    monkeypatch.setattr(ckpt, "available_memory", lambda: 16 * 8 - 1)
    with pytest.raises(UserError) as err:
        ckpt.check_declared_size(path)
    tells(err, str(path), "1.19e-07 GiB", "1.18e-07 GiB", "larger machine")


def _sparse_u8(path, n: int) -> int:
    """A safetensors file declaring one U8 tensor of n bytes, all holes; its header is 248 bytes whatever n
    is, so the bytes it holds (returned) do not depend on n."""

    header = json.dumps({"model/x": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    header += b" " * (248 - len(header))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n)
    return path.stat().st_blocks * 512


def test_the_sparse_file_limit_is_twice_the_bytes_held_plus_a_mib(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "available_memory", lambda: None)
    path = tmp_path / "s.safetensors"
    held = _sparse_u8(path, 2**21)
    if not 0 < held <= 2**16:
        pytest.skip("this file system does not make sparse files")
    limit = 2 * held + 2**20
    assert _sparse_u8(path, limit) == held
    ckpt.check_declared_size(path)  # exactly at the limit: accepted
    assert _sparse_u8(path, limit + 1) == held
    with pytest.raises(UserError) as err:
        ckpt.check_declared_size(path)
    tells(err, str(path), f"{(limit + 1) / 2**30:.3g} GiB", f"{held / 2**30:.3g} GiB", "intact checkpoint")


def test_a_file_system_that_reports_no_blocks_is_measured_by_the_file_size(tmp_path, monkeypatch):
    """st_blocks 0 for a non-empty file (some network and FUSE file systems): the size stands for the data."""

    class NoBlocks(type(Path())):
        def stat(self, *, follow_symlinks=True):
            st = super().stat(follow_symlinks=follow_symlinks)
            return os.stat_result(tuple(st)[:10], {"st_blocks": 0})

    monkeypatch.setattr(ckpt, "available_memory", lambda: None)
    path = NoBlocks(tmp_path / "s.safetensors")
    _header_only_file(path, {"format": ckpt.FORMAT}, 16 * 2**20)  # 64 MiB declared and 64 MiB long
    ckpt.check_declared_size(path)


def test_load_optimizer_state_names_the_file_that_lacks_optimizer_tensors(tmp_path):
    model, opt = _trained()
    path = tmp_path / "o.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": 1}}, optimizer=opt)
    meta, tensors = ckpt.read_meta(path), ckpt.load_tensors(path)
    listed = meta["optimizer"]["tensors"]
    with pytest.raises(UserError) as err:
        ckpt.load_optimizer_state(opt, {k: v for k, v in tensors.items() if k != listed[0]}, meta, path)
    tells(err, str(path), f"1 of its {len(listed)}", listed[0], "optimizer's moments", "complete checkpoint")


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_an_optimizer_resumed_from_a_checkpoint_takes_the_step_it_would_have_taken(tmp_path, name):
    """Two steps, save, load into a fresh model and optimizer, one more step: the weights equal those of
    the run that never stopped, bit for bit (AdamW's step count sets its bias correction, the moments its
    direction: either lost, the third step differs)."""
    from iattention.config import OptimConfig
    from iattention.train.optim import apply_step, build_optimizer, set_lr

    cfg = OptimConfig(name=name, lr=1e-2)
    batch = torch.randint(0, 97, (3, 2, 9), generator=torch.Generator().manual_seed(1))

    def step(model, opt, i):
        set_lr(opt, cfg.lr)
        logits, _ = model(batch[i, :, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[i, :, 1:].reshape(-1)).backward()
        apply_step(model, opt, cfg.grad_clip)

    torch.manual_seed(0)
    model = make_model(dtype=torch.float32).train()
    opt = build_optimizer(model, cfg, "cpu")
    step(model, opt, 0)
    step(model, opt, 1)
    path = tmp_path / "last.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {}, "state": {"step": 2}}, optimizer=opt)
    resumed = make_model(dtype=torch.float32, scale=0.01).train()  # other weights: all must come from the file
    tensors = ckpt.load_tensors(path)
    ckpt.load_model_state(resumed, tensors, path)
    opt2 = build_optimizer(resumed, cfg, "cpu")
    ckpt.load_optimizer_state(opt2, tensors, ckpt.read_meta(path), path)
    step(model, opt, 2)
    step(resumed, opt2, 2)
    for (k, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_token_ids_in_metadata_read_back_and_a_bad_one_is_named(tmp_path):
    """A conversion from Hugging Face keeps its source's bos/eos/pad ids ("token_ids"; an eos may be a list)."""
    model = make_model(dtype=torch.float32)
    path = tmp_path / "m.safetensors"
    good = {"bos_token_id": 0, "eos_token_id": [1, 2], "pad_token_id": -1}  # pad -1: as some configs say it
    ckpt.save_checkpoint(path, model, {"config": {}, "token_ids": good})
    assert ckpt.read_meta(path)["token_ids"] == good
    for bad, key in (([0], "token_ids: list"), ({"eos_token_id": "2"}, "token_ids.eos_token_id: str"),
                     ({"eos_token_id": []}, "token_ids.eos_token_id: list"),
                     ({"bos_token_id": 1.0}, "token_ids.bos_token_id: float"),
                     ({"eos_token_id": True}, "token_ids.eos_token_id: bool"),
                     ({"sep_token_id": 1}, "token_ids.sep_token_id: not one of")):
        ckpt.save_checkpoint(path, model, {"config": {}, "token_ids": bad})
        with pytest.raises(UserError, match=rf"m\.safetensors has bad metadata \({key}"):
            ckpt.read_meta(path)


# Every variant that holds structural tensors, on both families (GPT-2: per head; Llama: rotary pivots, GQA groups).
STRUCTURAL_MODELS = {
    "gpt2-canonical": dict(attention="canonical"),
    "gpt2-canonical-one-head": dict(attention="canonical", n_head=1),
    "gpt2-canonical-vo": dict(attention="canonical", canonical_halves="vo"),
    "llama-canonical-rope": dict(family="llama", attention="canonical", n_head=4, n_kv_head=2, n_embd=32, rot=4),
    "qwen3-canonical-qk-norm": dict(family="qwen3", attention="canonical", n_head=4, n_kv_head=2, n_embd=32),
}


@pytest.mark.parametrize("variant", STRUCTURAL_MODELS)
def test_a_structural_tensor_that_is_no_permutation_is_one_line_naming_it(tmp_path, variant):
    """A canonical layer's index tensors (rot_perm, k_perm, o_perm) are permutations: an entry out of range was a
    traceback in eval and convert, a repeated one another model, silently (exit 0). Each is refused where the
    checkpoint is read (load_any: eval, generate, convert, --init-from; a resume), naming the tensor."""
    from iattention.interop.load import load_any

    model = make_model(dtype=torch.float32, **STRUCTURAL_MODELS[variant])
    path = tmp_path / "c.safetensors"
    ckpt.save_checkpoint(path, model, {"config": {"model": model.config.to_dict()}})
    tensors = ckpt.load_tensors(path)
    structural = [k for k in tensors if k.endswith(ckpt.STRUCTURAL)]
    assert structural
    for key in structural:
        n = tensors[key].shape[-1]
        for value, problem in ((n, f"holds {n}, outside 0..{n - 1}"), (-1, "outside"), ("repeat", "times")):
            bad = tensors[key].clone()
            bad.view(-1, n)[-1, 1] = bad.view(-1, n)[-1, 0] if value == "repeat" else value
            save_file({**tensors, key: bad}, str(path), metadata={"iattention": json.dumps(
                {"config": {"model": model.config.to_dict()}, "format": ckpt.FORMAT})})
            with pytest.raises(UserError) as err:
                load_any(path)
            tells(err, str(path), key.removeprefix("model/"), problem, "permutation", "use another checkpoint")
    ckpt.save_checkpoint(path, model, {"config": {"model": model.config.to_dict()}})
    load_any(path)  # the intact file loads


@pytest.mark.parametrize("variant", ["standard", "canonical", "identity_q", "identity_ko"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen3"])
def test_every_tensor_of_every_variant_is_a_float_weight_or_a_checked_structural_tensor(variant, family):
    """check_structure knows the structural tensors by name (STRUCTURAL): a variant holding another non-float
    tensor would load unchecked. Every variant, both families, every canonical half."""
    halves = ("both", "qk", "vo") if variant == "canonical" else ("both",)
    for half in halves:
        groups = 4 if variant.startswith("identity") else 2  # the identity variants need a KV head per query head
        kw = dict(family=family, n_head=4, n_kv_head=groups, n_embd=32, rot=4) if family != "gpt2" else {}
        if family == "qwen3" and variant.startswith("identity"):  # no form under its query/key norm: refused
            continue
        model = make_model(dtype=torch.float32, attention=variant, canonical_halves=half, **kw)
        for k, v in ckpt.model_tensors(model).items():
            assert v.is_floating_point() or k.endswith(ckpt.STRUCTURAL), (variant, family, half, k, v.dtype)


# A live run's checkpoint writes, as fast as they come: each version replaces the file atomically (utils/atomic.py,
# as save_checkpoint does), two versions of different shapes in turn. Prints "ready" once the file exists.
_REPLACER = """
import sys
from pathlib import Path
from iattention.utils.atomic import write_bytes
target, versions = Path(sys.argv[1]), [Path(p).read_bytes() for p in sys.argv[2:]]
write_bytes(target, versions[0])
print("ready", flush=True)
for i in range(10**7):  # until the test kills it (bounded all the same)
    write_bytes(target, versions[i % len(versions)])
"""


@pytest.mark.parametrize("how", ["the open file by name", "its bytes"])
def test_a_checkpoint_read_while_a_live_run_replaces_it_is_one_whole_version(tmp_path, monkeypatch, how):
    """A run rewrites last.safetensors while eval, generate, convert, inspect, --init-from or a resume reads it:
    safetensors' load_file mapped the file by its name a second time ("size ... is smaller than the required
    mapping size", a traceback), and the metadata and the tensors were read in two opens (a model built from one
    version, its weights from the other). Every reader goes through read_checkpoint / load_tensors (one open, one
    version: load_model for eval, generate, convert, inspect and --init-from; the resume's _load_last). Under the
    race: a bounded number of reads, each whole and of one version; no sleeps. Both ways of reading the open file:
    safetensors mapping it by a name that is that file (/proc/self/fd/N), and, where a system has no such name,
    its bytes read once."""
    import subprocess
    import sys

    from helpers import subprocess_env
    from iattention.interop.load import load_model

    if how == "its bytes":
        monkeypatch.setattr(ckpt, "_open_file_path", lambda fd: None)
    versions = []
    for n_layer in (1, 3):  # shapes differ: tensors of one version never load into the other's model
        model = make_model(dtype=torch.float32, n_layer=n_layer)
        path = tmp_path / f"v{n_layer}.safetensors"
        ckpt.save_checkpoint(path, model, {"config": {"model": model.config.to_dict()}, "state": {"step": n_layer}})
        versions.append(path)
    target = tmp_path / "run" / "last.safetensors"
    writer = subprocess.Popen([sys.executable, "-c", _REPLACER, str(target), *map(str, versions)],
                              stdout=subprocess.PIPE, text=True, env=subprocess_env())
    counts, steps = set(), set()
    try:
        assert writer.stdout.readline() == "ready\n"  # the file exists and is being replaced from now on
        for _ in range(2000):  # load_file failed here about 1 read in 200
            counts.add(len(ckpt.load_tensors(target)))
        for _ in range(200):  # a two-open read mixed versions far more often
            model, meta = load_model(target)
            assert model.config.n_layer == meta["state"]["step"]
            meta, tensors = ckpt.read_checkpoint(target)
            assert sum(k.endswith("ln_1.weight") for k in tensors) == meta["state"]["step"]
            steps.add(meta["state"]["step"])
    finally:
        writer.kill()
        writer.wait()
    assert len(counts) == 2 and steps == {1, 3}  # both versions were read while the writer ran
