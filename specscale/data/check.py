"""Check a dataset's rows before they are used, with errors that name the file, the
line and the field (``datasets`` reports a truncated JSON line as "An error occurred
while generating the dataset", a missing column as ``KeyError: 'problem'``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from specscale.settings.search_policy import ConfigError

# Fields each schema's mapper reads (schemas.py); a tuple means "one of these".
REQUIRED = {
    "gsm8k": ("question", "answer"),
    "math500": ("problem", ("answer", "solution")),
    "olympiadbench": ("question", "final_answer"),
}


class DatasetFormatError(ConfigError):
    """A dataset file or row that cannot be read as the configured schema."""


def _missing(row: dict, schema: str) -> list[str]:
    out = []
    for field in REQUIRED[schema]:
        names = field if isinstance(field, tuple) else (field,)
        if not any(n in row for n in names):
            out.append(" or ".join(repr(n) for n in names))
    return out


def check_json_lines(files: Iterable[str], schema: str) -> None:
    """Every line of each JSON-lines file parses to an object with the schema's fields."""
    for name in files:
        path = Path(name)
        if not path.is_file():
            continue  # the loader names missing files (with the override to use)
        with open(path, encoding="utf-8") as fh:
            head = fh.read(1 << 12).lstrip()
        if head.startswith("["):
            continue  # one JSON array, not lines: datasets reads it whole
        rows = 0
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise DatasetFormatError(f"{path}:{lineno}: not valid JSON ({exc}); "
                                             "fix or remove the line (dataset.data_files)") from exc
                if not isinstance(row, dict):
                    raise DatasetFormatError(f"{path}:{lineno}: a row must be a JSON object, got {type(row).__name__}")
                missing = _missing(row, schema)
                if missing:
                    raise DatasetFormatError(f"{path}:{lineno}: missing field {', '.join(missing)} "
                                             f"(dataset.schema={schema} needs {_fields(schema)})")
                rows += 1
        if rows == 0:
            raise DatasetFormatError(f"{path}: no rows (empty file); check dataset.data_files")


def check_columns(dataset: Any, schema: str, where: str) -> None:
    """The loaded split has the schema's columns (parquet, csv, hub) and some rows."""
    columns = set(getattr(dataset, "column_names", None) or [])
    missing = _missing({c: None for c in columns}, schema)
    if missing:
        raise DatasetFormatError(f"{where}: missing column {', '.join(missing)} "
                                 f"(dataset.schema={schema} needs {_fields(schema)}; has {sorted(columns)})")
    if len(dataset) == 0:
        raise DatasetFormatError(f"{where}: no rows")


def _fields(schema: str) -> str:
    return ", ".join(" or ".join(f) if isinstance(f, tuple) else f for f in REQUIRED[schema])
