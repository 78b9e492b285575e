"""Read the records of an offline W&B run file (`run-*.wandb`).

The file is a 7-byte header followed by a LevelDB-style log: 32 KiB blocks of records
with a 7-byte header (crc32, little-endian length, type: 1 full, 2 first, 3 middle,
4 last), each payload a serialized `wandb_internal_pb2.Record`.
"""
from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
HEADER = 7


def records(path: Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, buf = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos: pos + HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        payload = data[pos + HEADER: pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            buf = payload
        elif kind == 2:
            buf = payload
            continue
        elif kind == 3:
            buf += payload
            continue
        else:
            buf += payload
        rec = pb.Record()
        rec.ParseFromString(buf)
        yield rec


def summary(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for rec in records(path):
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                out[item.key] = item.value_json
    return out


def run_id(path: Path) -> str:
    for rec in records(path):
        if rec.WhichOneof("record_type") == "run":
            return rec.run.run_id
    raise AssertionError(f"no run record in {path}")


def history_keys(path: Path) -> set[str]:
    keys: set[str] = set()
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            keys.update(item.key or "/".join(item.nested_key) for item in rec.history.item)
    return keys
