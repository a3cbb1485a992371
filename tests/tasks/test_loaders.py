"""Loading prompt rows from JSONL / JSON / CSV / Parquet / saved datasets, and GSM8K files."""

from __future__ import annotations

import csv
import itertools
import json

import pytest

from rlvr.tasks import get_task, gsm8k_final_answer, load_gsm8k, load_rows

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_keeps_every_column_and_chat_prompts_as_lists(tmp_path):
    path = write_jsonl(
        tmp_path / "data.jsonl",
        [{"prompt": "1+1=", "solution": 2, "level": "easy"}, {"prompt": CHAT, "solution": 4, "level": "easy"}],
    )
    rows = load_rows(path, answer_column="solution")
    assert rows[0]["prompt"] == "1+1=" and rows[0]["answer"] == "2" and rows[0]["level"] == "easy"
    assert rows[1]["prompt"] == CHAT  # kept as messages: the trainer applies the chat template
    assert "solution" not in rows[0]  # renamed to answer, not duplicated
    assert rows[0]["data_source"] == "data"  # the file stem
    assert rows[0]["prompt_id"] != rows[1]["prompt_id"]
    assert load_rows(path, answer_column="solution")[0]["prompt_id"] == rows[0]["prompt_id"]  # stable


def test_existing_data_source_and_prompt_id_are_kept(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x", "data_source": "mine", "prompt_id": "p7"}])
    row = load_rows(path)[0]
    assert (row["data_source"], row["prompt_id"]) == ("mine", "p7")


def test_json_array_csv_and_parquet_give_the_same_rows(tmp_path):
    records = [{"q": "3+4=", "a": "7"}, {"q": "5+6=", "a": "11"}]
    (tmp_path / "d.json").write_text(json.dumps(records))
    with (tmp_path / "d.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["q", "a"])
        writer.writeheader()
        writer.writerows(records)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    loaded = [
        [(r["prompt"], r["answer"]) for r in load_rows(tmp_path / name, prompt_column="q", answer_column="a")]
        for name in ("d.json", "d.csv", "d.parquet")
    ]
    assert loaded[0] == loaded[1] == loaded[2] == [("3+4=", "7"), ("5+6=", "11")]


def test_saved_datasets_folder_and_its_splits(tmp_path):
    import datasets

    data = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}]),
            "test": datasets.Dataset.from_list([{"prompt": "b", "answer": "2"}]),
        }
    )
    data.save_to_disk(str(tmp_path / "saved"))
    assert load_rows(tmp_path / "saved", split="test", answer_column="answer")[0]["prompt"] == "b"
    with pytest.raises(ValueError, match="pass split="):
        load_rows(tmp_path / "saved")
    with pytest.raises(ValueError, match="no split 'dev'"):
        load_rows(tmp_path / "saved", split="dev")


def test_missing_prompt_column_names_the_columns_and_the_fix(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "2+2?", "answer": "4"}])
    with pytest.raises(ValueError) as err:
        load_rows(path)
    message = str(err.value)
    assert "no prompt column 'prompt'" in message
    assert "['answer', 'question']" in message
    assert "prompt_column=" in message


def test_missing_answer_column_is_named_too(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?", "gold": "4"}])
    with pytest.raises(ValueError, match="no answer column 'answer'.*answer_column="):
        load_rows(path, answer_column="answer")


def test_bad_prompt_type_and_bad_format(tmp_path):
    with pytest.raises(ValueError, match="chat messages"):
        load_rows(write_jsonl(tmp_path / "d.jsonl", [{"prompt": 5}]))
    (tmp_path / "d.txt").write_text("hello")
    with pytest.raises(ValueError, match="fmt="):
        load_rows(tmp_path / "d.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_rows(tmp_path / "bad.jsonl")


GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A farm sells 1,200 eggs a day for 2 days.", "answer": "1,200*2 = 2,400\n#### 2,400"},
]


def test_gsm8k_loader_takes_the_final_answer_after_the_marks(tmp_path):
    rows = load_gsm8k(write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS))
    assert [r["answer"] for r in rows] == ["7", "2400"]  # thousands separator removed
    assert rows[0]["prompt"] == GSM8K_ROWS[0]["question"]
    assert rows[0]["solution"] == GSM8K_ROWS[0]["answer"]


def test_gsm8k_answer_without_marks_is_a_clear_error(tmp_path):
    assert gsm8k_final_answer("so 5\n####   -3 ") == "-3"
    with pytest.raises(ValueError, match="row 0.*####"):
        load_gsm8k(write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "just 7"}]))


def test_file_task_hash_split_is_disjoint_and_train_cycles(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(200)])
    task = get_task("file", path=str(path), rewards=["arithmetic"])
    assert task.default_rewards == [("arithmetic", 1.0)]
    evaluation = {r["prompt_id"] for r in task.eval_rows(1000)}
    train = [r["prompt_id"] for r in itertools.islice(task.train_rows(0), 400)]
    assert evaluation and not evaluation & set(train)
    assert len(evaluation) + len(set(train)) == 200  # every row is in exactly one split
    # Each epoch is a fresh permutation of the training rows.
    n = len(set(train))
    assert sorted(train[:n]) == sorted(train[n : 2 * n]) and train[:n] != train[n : 2 * n]


def test_gsm8k_task_with_a_separate_eval_file(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    test = write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS[:1])
    task = get_task("gsm8k", path=str(train), eval_path=str(test))
    assert task.name == "gsm8k" and task.default_rewards == [("math", 1.0)]
    assert [r["answer"] for r in task.eval_rows(10)] == ["7"]
    assert {r["answer"] for r in itertools.islice(task.train_rows(0), 4)} == {"2400"}  # the eval row is dropped


def test_gzipped_jsonl_and_csv(tmp_path):
    import gzip

    with gzip.open(tmp_path / "gsm8k.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    rows = load_gsm8k(tmp_path / "gsm8k.jsonl.gz")
    assert [r["answer"] for r in rows] == ["7", "2400"] and rows[0]["data_source"] == "gsm8k"
    with gzip.open(tmp_path / "d.csv.gz", "wt") as f:
        f.write("prompt,answer\n1+1=,2\n")
    assert load_rows(tmp_path / "d.csv.gz", answer_column="answer")[0]["answer"] == "2"
