"""Result files are readable by the people who share a store: atomic writes give them the
mode any file the user writes gets (the umask's), not mkstemp's 0600."""
import os
import stat

import pandas as pd

from specscale.metrics.writer import atomic_write, write_json


def test_atomic_writes_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "summary.json", {"a": 1})
        atomic_write(tmp_path / "t.parquet", lambda tmp: pd.DataFrame({"x": [1]}).to_parquet(tmp))
        os.umask(0o077)
        write_json(tmp_path / "private.json", {"b": 2})
    finally:
        os.umask(old)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert mode == {"summary.json": 0o644, "t.parquet": 0o644, "private.json": 0o600}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
