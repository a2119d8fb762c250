"""load_tasks: JSONL and Parquet task files, and errors that name the file and the line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vime.data import TaskFileError, load_tasks, validate_task


def write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_rows_load_with_ids_as_strings(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            json.dumps({"id": 1, "question": "1+1?", "answer": "2"}),
            "",
            json.dumps({"id": "b", "question": "2+2?", "answer": "4"}),
        ],
    )
    assert load_tasks(path, required=["question", "answer"]) == [
        {"id": "1", "question": "1+1?", "answer": "2"},
        {"id": "b", "question": "2+2?", "answer": "4"},
    ]


def test_parquet_rows_load(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"id": ["a", "b"], "question": ["q1", "q2"], "answer": ["1", "2"]}), path
    )
    assert load_tasks(path, required=["answer"]) == [
        {"id": "a", "question": "q1", "answer": "1"},
        {"id": "b", "question": "q2", "answer": "2"},
    ]


def test_bad_json_names_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ['{"id": "a"}', '{"id": "b",}'])
    with pytest.raises(TaskFileError, match=rf"{path}:2: invalid JSON"):
        load_tasks(path)


def test_missing_id_names_the_line_and_the_keys_present(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ['{"id": "a"}', '{"question": "q"}'])
    with pytest.raises(
        TaskFileError, match=rf"{path}:2: every task needs an 'id'.*keys present: \['question'\]"
    ):
        load_tasks(path)


def test_missing_required_key_names_the_row_and_what_the_env_needs(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["q"]}), path)
    with pytest.raises(TaskFileError, match=r"row 1 \(id 'a'\): missing key\(s\) \['answer'\]"):
        load_tasks(path, required=["question", "answer"])


def test_rows_must_be_objects(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ["[1, 2]"])
    with pytest.raises(TaskFileError, match=rf"{path}:1: a task must be a JSON object, got list"):
        load_tasks(path)


def test_duplicate_ids_name_both_places(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ['{"id": 7}', '{"id": "x"}', '{"id": "7"}'])
    with pytest.raises(
        TaskFileError, match=rf"{path}:3: duplicate task id '7' \(first at {path}:1\)"
    ):
        load_tasks(path)


@pytest.mark.parametrize("bad_id", [None, "", True, 1.5, ["a"]])
def test_ids_must_be_non_empty_strings_or_integers(bad_id):
    with pytest.raises(TaskFileError, match="every task needs an 'id'"):
        validate_task({"id": bad_id})


def test_missing_file_unknown_suffix_empty_file_and_broken_parquet(tmp_path):
    with pytest.raises(TaskFileError, match="task file not found"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "t.csv").write_text("id\n1\n")
    with pytest.raises(TaskFileError, match=r"unknown task file type '.csv'"):
        load_tasks(tmp_path / "t.csv")
    with pytest.raises(TaskFileError, match="the file has no tasks"):
        load_tasks(write_jsonl(tmp_path / "empty.jsonl", ["", "  "]))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(TaskFileError, match="not a readable Parquet file"):
        load_tasks(tmp_path / "bad.parquet")
