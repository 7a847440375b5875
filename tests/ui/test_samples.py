"""A run's page completes a prompt from the run's own checkpoint (really trained here, on CPU), by the code
`ablate generate` uses; a run without a checkpoint, or one outside the artifacts folder, is a clear refusal."""

from __future__ import annotations

import pytest
import yaml

from ablate import runner, store
from ablate.config import TrialConfig
from ablate.train import TrainerSettings, train
from ablate.train.generate import complete, load_run_model
from ablate.ui.app import make_app
from tests.ui.conftest import spec_file

pytestmark = pytest.mark.slow


def test_a_run_page_samples_from_its_checkpoint(tmp_path):
    from fastapi.testclient import TestClient

    path = spec_file(tmp_path, "sampled")
    data = yaml.safe_load(path.read_text())
    data.update({"budget": {"steps": 12, "hardware": "cpu"}, "tokenizer": {"vocab_size": 384},
                 "grid": [{"architecture": "mixer", "d_model": 32, "seeds": 2}]})
    data["defaults"]["context"] = 32
    path.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _, _, (trained, untrained) = runner.register(path, url)
    engine = store.connect(url)
    store.claim_run(engine, trained, "test")
    train(TrialConfig.model_validate(store.get_run(engine, trained).config),
          TrainerSettings(artifacts=tmp_path / "art", db_url=url, run_id=trained, progress=False, log_points=4))
    client = TestClient(make_app(store.reader(url), artifacts=tmp_path / "art"), base_url="http://127.0.0.1")
    got = client.get(f"/api/run/{trained}/sample", params={"prompt": "Once upon a time", "tokens": 8}).json()
    trial, model, tokenizer = load_run_model(trained, url, tmp_path / "art")
    assert got["completion"] == complete(model, tokenizer, "Once upon a time", trial.context, max_new=8)
    assert got["completion"].strip() and got["prompt"] == "Once upon a time"  # the continuation, without the prompt
    none = client.get(f"/api/run/{untrained}/sample").json()["error"]
    assert f"run {untrained} (pending) has no checkpoint" in none
    elsewhere = TestClient(make_app(store.reader(url), artifacts=tmp_path / "other"), base_url="http://127.0.0.1")
    assert "outside the artifacts folder" in elsewhere.get(f"/api/run/{trained}/sample").json()["error"]
    assert "tokens from 1 to 256" in client.get(f"/api/run/{trained}/sample", params={"tokens": 0}).json()["error"]
