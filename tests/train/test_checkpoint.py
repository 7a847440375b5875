"""Checkpoints written in a thread (ablate/train/checkpoint.py Writer): training goes on while the file is written,
the snapshot is the state at the step it was taken, and a failed write is said at the next checkpoint or the end."""

from __future__ import annotations

import threading

import pytest
import torch

from ablate.config.errors import AblateError
from ablate.train.checkpoint import Writer, snapshot
from ablate.train.state import Progress


def test_a_checkpoint_is_written_while_training_goes_on_and_holds_the_state_it_was_taken_at(tmp_path, monkeypatch):
    """The file write is held back (torch.save waits for the test's word, then writes for real): `save` returns at
    once, the weights change meanwhile, and what reaches the file is the snapshot: the weights at its step."""
    from ablate.train import checkpoint

    release, writing = threading.Event(), threading.Event()
    real_save = torch.save

    def held_save(*args, **kwargs):
        writing.set()
        assert release.wait(60)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", held_save)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    path = tmp_path / "checkpoint.pt"
    before = model.weight.detach().clone()
    writer = Writer()
    writer.save(path, snapshot(model, optimizer, None, Progress(step=7)))  # returns while the write waits
    assert writing.wait(60) and not path.exists()
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on
    release.set()
    writer.wait()
    saved = torch.load(path, weights_only=True)
    assert torch.equal(saved["model"]["weight"], before) and saved["progress"]["step"] == 7


def test_a_write_that_failed_is_said_at_the_next_checkpoint_and_a_final_one_is_still_written(tmp_path):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    (tmp_path / "blocked").write_text("a file where the run's folder should be")
    writer = Writer()
    writer.save(tmp_path / "blocked" / "checkpoint.pt", snapshot(model, optimizer, None, Progress()))
    with pytest.raises(AblateError, match="cannot write checkpoint"):
        writer.save(tmp_path / "ok.pt", snapshot(model, optimizer, None, Progress()))
    writer.save(tmp_path / "blocked" / "checkpoint.pt", snapshot(model, optimizer, None, Progress()))
    writer.save(tmp_path / "final.pt", snapshot(model, optimizer, None, Progress(step=3)), wait=True)  # the end
    assert torch.load(tmp_path / "final.pt", weights_only=True)["progress"]["step"] == 3
