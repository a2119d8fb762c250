"""Checkpoints: resume equals continuing, atomic writes, clear errors for broken folders."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from trainer_data import config, make_batch

from vime.training import checkpoint as ckpt
from vime.training.checkpoint import CheckpointError, atomic_checkpoint, read_manifest
from vime.training.torch_backend import TorchTrainer


def params(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_save_load_step_equals_continuing(untied_qwen3, tmp_path):
    cfg = config(untied_qwen3, lr_warmup_iters=1, lr_decay_style="cosine", train_iters=4)
    first, second = make_batch(10), make_batch(11)
    a = TorchTrainer(cfg)
    a.train_step(first)
    a.save(tmp_path / "step1")
    after_save = (random.random(), np.random.rand(), torch.rand(2))
    continued = a.train_step(second)

    b = TorchTrainer(cfg)
    b.load(tmp_path / "step1")
    assert b.weight_version == 1
    after_load = (random.random(), np.random.rand(), torch.rand(2))
    assert after_load[:2] == after_save[:2] and torch.equal(after_load[2], after_save[2])
    resumed = b.train_step(second)
    assert resumed["lr"] == continued["lr"]  # the schedule resumed at step 2
    assert resumed["loss"] == continued["loss"] and resumed["grad_norm"] == continued["grad_norm"]
    for name, p in params(b).items():
        assert torch.equal(p, params(a)[name]), name
    assert b.weight_version == a.weight_version == 2


def test_crash_mid_save_leaves_the_old_checkpoint_intact(untied_qwen3, tmp_path, monkeypatch):
    trainer = TorchTrainer(config(untied_qwen3))
    target = tmp_path / "latest"
    trainer.save(target)
    saved = params(trainer)
    trainer.train_step(make_batch(12))

    real_save = ckpt.save_object

    def crash_on_optimizer(obj, path):
        if path.name == "optimizer.pt":
            path.write_bytes(b"half a file")
            raise OSError("disk full")
        real_save(obj, path)

    monkeypatch.setattr(ckpt, "save_object", crash_on_optimizer)
    with pytest.raises(OSError, match="disk full"):
        trainer.save(target)
    assert not ckpt.temp_dir_for(target).exists()

    fresh = TorchTrainer(config(untied_qwen3))
    fresh.train_step(make_batch(13))
    fresh.load(target)
    assert fresh.weight_version == 0
    for name, p in params(fresh).items():
        assert torch.equal(p, saved[name]), name


def test_saving_over_a_checkpoint_replaces_it(untied_qwen3, tmp_path):
    trainer = TorchTrainer(config(untied_qwen3))
    trainer.save(tmp_path / "ck")
    trainer.train_step(make_batch(14))
    trainer.save(tmp_path / "ck")
    assert read_manifest(tmp_path / "ck")["files"]["model.pt"] > 0
    fresh = TorchTrainer(config(untied_qwen3))
    fresh.load(tmp_path / "ck")
    assert fresh.weight_version == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_manifest(tmp_path / "nope")


def test_folder_without_manifest_is_not_a_checkpoint(untied_qwen3):
    with pytest.raises(CheckpointError, match=r"vime_checkpoint\.json is missing"):
        read_manifest(untied_qwen3)


def test_truncated_file_is_reported_as_corrupt(tmp_path):
    with atomic_checkpoint(tmp_path / "ck", {"backend": "torch"}) as tmp:
        (tmp / "model.pt").write_bytes(b"x" * 100)
    (tmp_path / "ck" / "model.pt").write_bytes(b"x" * 10)
    with pytest.raises(CheckpointError, match="has 10 bytes, the manifest says 100"):
        read_manifest(tmp_path / "ck")


def test_unreadable_file_is_reported(untied_qwen3, tmp_path):
    trainer = TorchTrainer(config(untied_qwen3))
    trainer.save(tmp_path / "ck")
    model_file = tmp_path / "ck" / "model.pt"
    model_file.write_bytes(b"\0" * model_file.stat().st_size)  # same size, garbage inside
    with pytest.raises(CheckpointError, match=r"model\.pt' is unreadable"):
        trainer.load(tmp_path / "ck")


def test_checkpoint_of_another_backend_is_refused(untied_qwen3, tmp_path):
    with atomic_checkpoint(tmp_path / "mg", {"backend": "megatron"}):
        pass
    with pytest.raises(CheckpointError, match="written by the 'megatron' backend"):
        TorchTrainer(config(untied_qwen3)).load(tmp_path / "mg")


def test_trainer_files_are_written_without_zip_crcs_and_the_setting_is_restored(
    untied_qwen3, tmp_path
):
    # torch.load does not check the CRC-32s of torch.save's zip records, and a run
    # checkpoint hashes every file: a checkpoint skips computing them, and only it.
    import zipfile

    trainer = TorchTrainer(config(untied_qwen3))
    trainer.train_step(make_batch(10))
    trainer.save(tmp_path / "ck")
    for name in ("model.pt", "optimizer.pt"):
        records = zipfile.ZipFile(tmp_path / "ck" / name).infolist()
        data = [r for r in records if "/data/" in r.filename]
        assert data and all(r.CRC == 0 for r in data), name
    assert torch.serialization.get_crc32_options() is True
    torch.save(torch.ones(3), tmp_path / "user.pt")
    assert all(r.CRC != 0 for r in zipfile.ZipFile(tmp_path / "user.pt").infolist()[1:2])
    restored = TorchTrainer(config(untied_qwen3))
    restored.load(tmp_path / "ck")
    for name, p in params(restored).items():
        assert torch.equal(p, params(trainer)[name]), name


def test_the_manifest_has_the_sha256_of_each_file_hashed_as_it_was_written(untied_qwen3, tmp_path):
    import hashlib

    trainer = TorchTrainer(config(untied_qwen3))
    trainer.train_step(make_batch(10))
    trainer.save(tmp_path / "ck")
    digests = ckpt.recorded_digests(tmp_path / "ck")
    assert set(digests) == {"model.pt", "optimizer.pt", "rng_rank0.pt"}
    for name, digest in digests.items():
        assert digest == hashlib.sha256((tmp_path / "ck" / name).read_bytes()).hexdigest()
    assert not list((tmp_path / "ck").glob("*.sha256"))  # the sidecars went into the manifest
    assert ckpt.recorded_digests(tmp_path / "nothing") == {}


def test_a_save_is_flushed_in_steps_and_hashes_every_byte(tmp_path):
    import hashlib

    obj = {"a": torch.arange(300_000, dtype=torch.float32), "b": list(range(10))}
    path = tmp_path / "o.pt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        writer = ckpt._HashingWriter(fd, flush_bytes=64 << 10)  # many flushes in one save
        torch.save(obj, writer)
        writer.finish()
    finally:
        os.close(fd)
    assert writer.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = torch.load(path)
    assert torch.equal(loaded["a"], obj["a"]) and loaded["b"] == obj["b"]
