"""scripts/attribution_data.py --registered: when a registered experiment's data began, read from its cells' marks."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from script_modules import load_script

data = load_script("scripts/attribution_data.py")


def _mark(folder, created):
    folder.mkdir(parents=True)
    body = {"written_by": "dfpo train"} | ({"created": created} if created else {})
    (folder / ".dfpo-run.json").write_text(json.dumps(body))
    return folder / ".dfpo-run.json"


def test_the_data_began_at_the_oldest_cell_mark_of_any_set(tmp_path):
    _mark(tmp_path / "a" / "gspo" / "seed1", "2026-12-06T03:08:30+0000")
    _mark(tmp_path / "b" / "gspo" / "seed2", "2026-12-06T03:09:46+0000")
    assert data.data_started([tmp_path / "a", tmp_path / "b"]) == datetime(2026, 12, 6, 3, 8, 30, tzinfo=UTC)


def test_a_mark_without_its_creation_time_falls_back_on_the_file_time(tmp_path):
    mark = _mark(tmp_path / "a" / "x", None)
    os.utime(mark, (1_000_000_000, 1_000_000_000))
    assert data.mark_created(mark) == datetime.fromtimestamp(1_000_000_000, tz=UTC)
