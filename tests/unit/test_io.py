"""Files a user keeps are written atomically and run records only ever appended."""

import json
import os

import pytest

from planner.io import append_jsonl, read_jsonl, write_text_atomic


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "plans.csv"
    write_text_atomic(p, "a,b\n1,2\n")
    write_text_atomic(p, "a,b\n3,4\n")
    assert p.read_text() == "a,b\n3,4\n"
    assert os.listdir(p.parent) == ["plans.csv"]


def test_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "x.txt"
    write_text_atomic(p, "old")

    with pytest.raises(TypeError):
        write_text_atomic(p, 123)  # type: ignore[arg-type]  # f.write(int) fails mid-way
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.txt"]


def test_append_keeps_earlier_records(tmp_path):
    p = tmp_path / "runs.jsonl"
    append_jsonl(p, {"ok": True, "n": 1})
    append_jsonl(p, {"ok": False, "n": 2})
    assert [r["n"] for r in read_jsonl(p)] == [1, 2]
    assert json.loads(p.read_text().splitlines()[0]) == {"ok": True, "n": 1}
