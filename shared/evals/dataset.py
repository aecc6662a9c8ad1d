"""The cases of an eval, from a JSONL or CSV file.

Each case has an ``id`` (unique), an ``input`` and usually an ``expected`` answer; ``thread`` and
``metadata`` are optional, and any other column is kept for scorers (``case.columns``). A line that
cannot be read is a :class:`DatasetError` naming the file and the line: nothing is half-loaded.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.evals.errors import EvalSpecError

__all__ = ["MAX_CASES", "MAX_DATASET_BYTES", "Case", "DatasetError", "load_dataset", "parse_dataset"]

#: Cases in one dataset, and the size of its file: an eval's state must fit comfortably in Redis.
MAX_CASES = 50_000
MAX_DATASET_BYTES = 64 * 2**20
_KNOWN = frozenset({"id", "input", "expected", "thread", "metadata"})


class DatasetError(EvalSpecError):
    """A dataset that cannot be read; the message names the file and line."""


class Case(BaseModel):
    """One dataset case."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=200)
    input: str
    expected: Any = None
    thread: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: Every other column of the row, for scorers (e.g. ``expected_tools``).
    columns: dict[str, Any] = Field(default_factory=dict)


def load_dataset(path: Path) -> tuple[list[Case], bytes]:
    """The cases of the file at ``path``, and its bytes (part of the eval's identity)."""
    try:
        size = path.stat().st_size
        if size > MAX_DATASET_BYTES:
            raise DatasetError(f"dataset {str(path)!r} is {size} bytes, more than {MAX_DATASET_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {str(path)!r}: {exc.strerror or exc}") from None
    return parse_dataset(data, path.name), data


def parse_dataset(data: bytes, name: str) -> list[Case]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset {name!r} is not UTF-8 (byte {exc.start})") from None
    if name.lower().endswith(".csv"):
        rows = _csv_rows(text, name)
    elif name.lower().endswith((".jsonl", ".ndjson")):
        rows = _jsonl_rows(text, name)
    else:
        raise DatasetError(f"dataset {name!r}: the file name must end in .jsonl or .csv")
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        case = _case(row, name, line)
        if case.id in seen:
            raise DatasetError(f"{name}:{line}: case id {case.id!r} repeats line {seen[case.id]}")
        seen[case.id] = line
        cases.append(case)
        if len(cases) > MAX_CASES:
            raise DatasetError(f"dataset {name!r} has more than {MAX_CASES} cases")
    if not cases:
        raise DatasetError(f"dataset {name!r} has no cases")
    return cases


def _jsonl_rows(text: str, name: str) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{name}:{number}: not valid JSON: {exc}") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{name}:{number}: a case is a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _csv_rows(text: str, name: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    rows = []
    try:
        for row in reader:
            line = reader.line_num
            if None in row or any(value is None for value in row.values()):
                raise DatasetError(f"{name}:{line}: the row does not have one value per column")
            fields: dict[str, Any] = dict(row)
            if fields.get("metadata"):
                try:
                    fields["metadata"] = json.loads(fields["metadata"])
                except ValueError as exc:
                    raise DatasetError(f"{name}:{line}: metadata is not a JSON object: {exc}") from None
            else:
                fields.pop("metadata", None)
            if fields.get("thread") == "":
                fields.pop("thread")
            rows.append((line, fields))
    except csv.Error as exc:
        raise DatasetError(f"{name}:{reader.line_num}: {exc}") from None
    return rows


def _case(row: dict[str, Any], name: str, line: int) -> Case:
    for field in ("id", "input"):
        if field not in row:
            raise DatasetError(f"{name}:{line}: the case has no {field!r}")
    case_id, text = row["id"], row["input"]
    if isinstance(case_id, int) and not isinstance(case_id, bool):
        case_id = str(case_id)
    if not isinstance(case_id, str) or not case_id or len(case_id) > 200:
        raise DatasetError(f"{name}:{line}: id must be text of 1..200 characters")
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(f"{name}:{line}: input must be non-empty text")
    thread = row.get("thread")
    if thread is not None and not isinstance(thread, str):
        raise DatasetError(f"{name}:{line}: thread must be text")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DatasetError(f"{name}:{line}: metadata must be an object")
    columns = {k: v for k, v in row.items() if k not in _KNOWN}
    return Case(
        id=case_id,
        input=text,
        expected=row.get("expected"),
        thread=thread,
        metadata=metadata,
        columns=columns,
    )
