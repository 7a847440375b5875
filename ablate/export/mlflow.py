"""Runs into MLflow: one experiment per sweep, one MLflow run per ablate run found again by its tag
`ablate.fingerprint`, the trial config as parameters, the status as the run's state and tag `ablate.status`, final
metrics, and the curves as metric histories (`train_loss`, `eval_loss`) at their steps.

Only points past what a run already holds are sent: its tags `ablate.last_step.SPLIT` say how far it is, read for
every run of the experiment with one paged search, so an export run again (or after an interruption) updates and
never duplicates, and costs next to nothing when nothing changed."""

from __future__ import annotations

from typing import Any

from ablate.export.runs import ExportRun

STATUS = {"completed": "FINISHED", "failed": "FAILED", "oom": "FAILED", "diverged": "FAILED", "cancelled": "KILLED",
          "preempted": "KILLED", "running": "RUNNING", "pending": "SCHEDULED"}
BATCH = 1000  # MLflow's log_batch takes at most 1,000 metrics (and 100 params)


class MlflowTarget:
    def __init__(self, uri: str, sweep: str) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(sweep)
        self.experiment = found.experiment_id if found else self.client.create_experiment(sweep, tags={"ablate.sweep": sweep})
        self.known: dict[str, Any] = {}
        token = None
        while True:
            page = self.client.search_runs([self.experiment], max_results=1000, page_token=token)
            self.known.update({r.data.tags["ablate.fingerprint"]: r for r in page if "ablate.fingerprint" in r.data.tags})
            token = page.token
            if not token:
                break

    def export(self, run: ExportRun) -> int:
        """Create or update the run; returns how many points were new."""
        from mlflow.entities import Metric, Param, RunTag

        held = self.known.get(run.fingerprint)
        if held is None:
            held = self.client.create_run(self.experiment, start_time=run.start_ms(), run_name=run.name,
                                          tags={"ablate.fingerprint": run.fingerprint})
            params = [Param(k[:250], str(v)[:6000]) for k, v in run.params.items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(held.info.run_id, params=params[i:i + 100])
        tags = held.data.tags
        metrics, steps = [], {}
        for split, points in run.curves.items():
            done = int(tags.get(f"ablate.last_step.{split}", -1))
            metrics += [Metric(f"{split}_loss", p.loss, run.start_ms() + int(p.seconds * 1000), p.step)
                        for p in points if p.step > done]
            if points and points[-1].step > done:
                steps[f"ablate.last_step.{split}"] = str(points[-1].step)
        new = len(metrics)
        last = max((p.step for points in run.curves.values() for p in points), default=0)
        metrics += [Metric(k, v, run.start_ms(), last) for k, v in run.final.items() if held.data.metrics.get(k) != v]
        want = {"ablate.status": run.status, "ablate.run_id": str(run.run_id), **steps,
                **({"ablate.error": run.error[:5000]} if run.error else {})}
        changed = [RunTag(k, v) for k, v in want.items() if tags.get(k) != v]
        # points first, then the tags that say they were sent: an export stopped in between sends them again
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(held.info.run_id, metrics=metrics[i:i + BATCH])
        if changed:
            self.client.log_batch(held.info.run_id, tags=changed)
        state = STATUS.get(run.status, "RUNNING")
        if held.info.status != state:
            self.client.update_run(held.info.run_id, status=state)
        return new

    def where(self) -> dict[str, Any]:
        return {"experiment": self.experiment}
