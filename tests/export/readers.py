"""Reading exports back with each tracker's own reader: MLflow's client, TensorBoard's event file loader, and W&B's
own protobuf records for its offline `.wandb` files.

W&B 0.31 ships no Python reader of `.wandb` files any more (its datastore module moved into the Go `wandb-core`).
The file is LevelDB's log format (https://github.com/google/leveldb/blob/main/doc/log_format.md) behind a 7-byte
header (":W&B", magic, version): 32 KiB blocks of records (crc32, length, type FULL/FIRST/MIDDLE/LAST, data).
`wandb_records` walks those frames and decodes each payload with wandb's own `wandb_internal_pb2.Record`."""

from __future__ import annotations

import json
import struct
import zlib
from collections import defaultdict
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    records, pending, at = [], b"", HEADER
    while at + HEADER <= len(data):
        left = BLOCK - at % BLOCK
        if left < HEADER:  # a block's trailer: zeros
            at += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[at:at + HEADER])
        if kind == 0 and length == 0:  # zero padding at the end of a block or file
            at += left
            continue
        body = data[at + HEADER:at + HEADER + length]
        assert zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF == crc, f"bad checksum at {at} in {path}"
        at += HEADER + length
        pending = body if kind in (FULL, FIRST) else pending + body
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_runs(folder: Path) -> dict[str, dict]:
    """Per W&B run id, over every offline run folder: its config, summary, and history points as
    {key: [(step, value), ...]} in the order logged."""
    out: dict[str, dict] = defaultdict(lambda: {"config": {}, "summary": {}, "history": defaultdict(list), "files": 0})
    for file in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        run_id = file.stem.removeprefix("run-")
        run = out[run_id]
        run["files"] += 1
        for r in wandb_records(file):
            kind = r.WhichOneof("record_type")
            if kind in ("config", "run"):  # the config comes with the run record, and in later config records
                updates = r.config.update if kind == "config" else r.run.config.update
                run["config"].update({_key(u): json.loads(u.value_json) for u in updates})
            elif kind == "summary":
                run["summary"].update({_key(u): json.loads(u.value_json) for u in r.summary.update})
            elif kind == "history":
                items = {_key(i): json.loads(i.value_json) for i in r.history.item}
                for key, value in items.items():
                    if not key.startswith("_"):
                        run["history"][key].append((items.get("_step", r.history.step.num), value))
    return dict(out)


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in every event file of a run's folder, by tag, as (step, value) in file order."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.util import tensor_util

    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for file in sorted(folder.glob("events.out.tfevents.*")):
        for event in LegacyEventFileLoader(str(file)).Load():
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out[v.tag].append((event.step, v.simple_value))
                elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "scalars":
                    out[v.tag].append((event.step, float(tensor_util.make_ndarray(v.tensor))))
    return dict(out)


def tensorboard_texts(folder: Path) -> dict[str, list[str]]:
    """Every text summary of a run's folder, by tag."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.util import tensor_util

    out: dict[str, list[str]] = defaultdict(list)
    for file in sorted(folder.glob("events.out.tfevents.*")):
        for event in LegacyEventFileLoader(str(file)).Load():
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "text":
                    out[v.tag].append(tensor_util.make_ndarray(v.tensor).item().decode())
    return dict(out)
