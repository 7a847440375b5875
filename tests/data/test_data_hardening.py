"""Hardening of the token cache: a damaged cache is detected and rebuilt.

(A campaign across the house: `pytest -m hardening` runs all of it.)
"""

from __future__ import annotations


import pytest
import torch

from tests.train.test_train import make_trial



pytestmark = pytest.mark.hardening


def test_a_damaged_token_cache_is_detected_and_rebuilt(tmp_path):
    from ablate.data import cache_intact, prepare

    trial = make_trial()
    first = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path, progress=False)
    rows = first.train.batch(list(range(4)))[0].clone()
    target = first.cache_dir / "train.bin"
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF
    target.write_bytes(bytes(data))
    assert not cache_intact(first.cache_dir)
    again = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path, progress=False)
    assert cache_intact(again.cache_dir)
    assert torch.equal(again.train.batch(list(range(4)))[0], rows)
