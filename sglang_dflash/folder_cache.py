"""A folder built once and reused: built into a temporary sibling, committed by one rename.

Readers never see a half-built folder: `path` exists only once its builder finished, with a marker
file inside (written last, so a folder built by an older, in-place builder counts only when
complete). A failing build leaves nothing behind; two processes building at once both finish and
one rename wins. Used for the embedded model, the generated tiny models and test pairs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Callable, Optional

MARKER = ".complete"


def build_once(path: str, build: Callable[[str], Optional[dict]], marker: str = MARKER) -> str:
    """`path`, built by `build(tmp)` on first use. build fills the empty folder tmp; what it returns
    (a JSON-able dict, e.g. a checksum) is stored in the marker. A folder at `path` without the
    marker is a stale build: it is replaced."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, marker)):
        return path
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700; the built folder is shared like any other
    try:
        info = build(tmp)
        with open(os.path.join(tmp, marker), "w") as f:
            json.dump(info or {}, f)
        try:
            os.rename(tmp, path)  # the commit
        except OSError:  # `path` exists: a concurrent builder won, or a stale build is in the way
            if not os.path.exists(os.path.join(path, marker)):
                shutil.rmtree(path, ignore_errors=True)
                os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
