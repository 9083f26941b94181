"""A JSONL file of results written one row at a time, so an interrupted run resumes where it stopped.

Used by offline.py (results), train/datagen.py (answers) and train/features.py (reads datagen's
file while datagen may still be appending to it).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable, Iterator


def read_rows(path: str) -> Iterator[dict]:
    """Every complete row of `path` (nothing when it does not exist). A last line without its
    newline (being written, or cut by a crash) and lines that are not JSON objects are skipped."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                return
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield row


def drop_torn_tail(path: str) -> None:
    """Cut a half-written last line (an interrupted run) so the next append starts a fresh line.
    Only for a file no other process is writing."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def done_ids(path: str, key: str = "id") -> set:
    """The `key` of every complete row already written (a torn last line is dropped first)."""
    drop_torn_tail(path)
    ids = set()
    for row in read_rows(path):
        with contextlib.suppress(KeyError, TypeError):  # no id, or an unhashable one: redone
            ids.add(row[key])
    return ids


@contextlib.contextmanager
def append_rows(path: str) -> Iterator[Callable[[dict], None]]:
    """`with append_rows(path) as write: write(row)`: each row is one line, flushed when written."""
    with open(path, "a") as f:

        def write(row: dict) -> None:
            f.write(json.dumps(row) + "\n")  # one write per row: a crash tears at most the last line
            f.flush()

        yield write
