"""Training prompt pools: every GSM8K and MBPP stub is a Python function holding its task,
and the pools never reach into the evaluation splits `perf.datasets` defines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from drafter_builder.prompts import load_prompts, pool
from perf.datasets import MBPP_TEST_IDS, MBPP_TRAINING_IDS, named_requests

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.mark.skipif(not (DATA / "gsm8k_train.jsonl").is_file(), reason="shared data folder not present")
def test_every_gsm8k_stub_is_a_python_function_whose_docstring_holds_its_question():
    pairs = load_prompts(DATA, {"gsm8k_train": 7473, "gsm8k_stub": 7473}, seed=0)
    questions = {p for name, p in pairs if name == "gsm8k_train"}
    stubs = [p for name, p in pairs if name == "gsm8k_stub"]
    assert len(set(stubs)) == 7473
    for stub in stubs:
        fn = ast.parse(stub).body[-1]
        assert isinstance(fn, ast.FunctionDef) and fn.name == "solution", stub
        assert ast.get_docstring(fn).split("\n")[0] in {q.strip() for q in questions}


@pytest.mark.skipif(not (DATA / "mbpp.jsonl").is_file(), reason="shared data folder not present")
@pytest.mark.parametrize("pool", ["mbpp_stub", "mbpp_doctest"])
def test_every_mbpp_stub_of_the_training_split_is_a_python_function_with_a_docstring(pool):
    stubs = [p for _, p in load_prompts(DATA, {pool: 463}, seed=0)]
    assert len(set(stubs)) == 463
    for stub in stubs:
        fn = ast.parse(stub).body[-1]
        assert isinstance(fn, ast.FunctionDef) and ast.get_docstring(fn), stub
    with pytest.raises(ValueError, match="holds 463 prompts"):
        load_prompts(DATA, {pool: 464}, seed=0)


@pytest.mark.skipif(not (DATA / "mbpp.jsonl").is_file(), reason="shared data folder not present")
def test_training_pools_hold_no_prompt_of_the_evaluation_splits():
    assert not set(MBPP_TRAINING_IDS) & set(MBPP_TEST_IDS)
    for name, pools in (("mbpp", ("mbpp_train",)), ("gsm8k", ("gsm8k_train", "gsm8k_stub"))):
        evaluated = [r.prompt for r in named_requests(name, data_dir=DATA)]
        training = [p for source in pools for p in pool(DATA, source)]
        assert len(training) > len(set(evaluated) & set(training)) == 0
        assert not any(q.strip() in p for q in evaluated[:50] for p in training)  # not even as a stub's docstring
