"""Training data from the target's own greedy continuations: a time-boxed build resumes
where it stopped, and refuses shards written from other prompts; MBPP tasks become
HumanEval-style stubs; the final-layer tap carries the target's greedy law."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from runtime.drafter.train_data import (STUB_DOC_LINES, answered_prompts, build_dataset, chat_ids, load_prompts, mbpp_stub,
                                        shard_paths, stdlib_stubs)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

PROMPTS = [("gsm8k_train", "What is 2 + 3?"), ("self_chat", "Name a colour."), ("mbpp_train", "Sum a list."),
           ("gsm8k_train", "Halve 10."), ("self_chat", "Say hi.")]


def test_a_time_boxed_build_resumes_and_keeps_the_shards_it_already_wrote(embedded_hf, tmp_path):
    model, tok = embedded_hf
    first = build_dataset(model, tok, PROMPTS, [1, 3], tmp_path, batch_size=2, max_new_tokens=3, budget_s=0.0)
    assert first["sequences"] == 2 and len(shard_paths(tmp_path)) == 1  # the time box stopped it after one window
    kept = torch.load(tmp_path / "shard_00000.pt", weights_only=True)
    full = build_dataset(model, tok, PROMPTS, [1, 3], tmp_path, batch_size=2, max_new_tokens=3,
                         budget_s=float("inf"))
    assert full["sequences"] == 5 and len(shard_paths(tmp_path)) == 3
    assert full["sources"] == {"gsm8k_train": 2, "self_chat": 2, "mbpp_train": 1}
    assert full["dtype"] == "float32"  # the decoding precision is recorded
    again = torch.load(tmp_path / "shard_00000.pt", weights_only=True)
    assert all(torch.equal(a["taps"], b["taps"]) for a, b in zip(kept, again))
    assert json.loads((tmp_path / "meta.json").read_text())["seconds"] >= first["seconds"]
    with pytest.raises(ValueError, match="other prompts"):
        build_dataset(model, tok, PROMPTS[::-1], [1, 3], tmp_path, batch_size=2, max_new_tokens=3, budget_s=0.0)


def test_answered_prompts_are_those_of_every_other_data_run(embedded_hf, tmp_path):
    """A new data run drops prompts an earlier run answered (a greedy repeat adds nothing)."""
    model, tok = embedded_hf
    build_dataset(model, tok, PROMPTS[:2], [1, 3], tmp_path / "a", batch_size=2, max_new_tokens=2, budget_s=float("inf"))
    build_dataset(model, tok, PROMPTS[3:4], [1, 3], tmp_path / "b", batch_size=2, max_new_tokens=2, budget_s=float("inf"))
    ids = {i: tuple(chat_ids(tok, p)) for i, (_, p) in enumerate(PROMPTS)}
    assert answered_prompts(tmp_path) == {ids[0], ids[1], ids[3]}
    assert answered_prompts(tmp_path, skip=tmp_path / "b") == {ids[0], ids[1]}  # a run resuming keeps its own
    assert answered_prompts(tmp_path / "empty") == set()


def test_the_final_layer_tap_is_the_normed_last_hidden_state_so_lm_head_of_it_is_the_greedy_law(embedded_hf, tmp_path):
    """Distillation (kd_weight) reads the target's law as lm_head(final tap): guard that premise."""
    model, tok = embedded_hf
    last = model.config.num_hidden_layers - 1
    build_dataset(model, tok, PROMPTS[:2], [1, last], tmp_path, batch_size=2, max_new_tokens=6, budget_s=float("inf"))
    lm_head = model.get_output_embeddings().weight
    hidden = model.config.hidden_size
    for rec in torch.load(tmp_path / "shard_00000.pt", weights_only=True):
        ids, pl = rec["ids"].long(), rec["prompt_len"]
        final = rec["taps"][:, hidden:].float()  # [T-1, H], tap of position p predicts ids[p+1]
        greedy = (final[pl - 1 :] @ lm_head.T).argmax(-1)
        response = ids[pl:]
        assert torch.equal(greedy[: response.numel()], response)


def test_an_mbpp_task_becomes_a_stub_of_the_function_its_test_calls():
    row = {"text": "Write a function to count items.", "task_id": 600,
           "code": "def helper(x):\n    return x\ndef count_items(xs, k) : \n    return len(xs)",
           "test_list": ["assert count_items([1, 2], 3) == 2", "assert count_items([], 1) == 0"]}
    stub = mbpp_stub(row)
    assert stub == ('def count_items(xs, k) :\n    """ Write a function to count items.\n'
                    '    >>> count_items([1, 2], 3)\n    2\n    """\n')
    assert mbpp_stub({**row, "code": "x = 1"}) is None


def test_the_doctest_stub_opens_with_the_solution_imports_and_holds_every_equality_test():
    row = {"text": "Write a function to sort items.", "task_id": 700,
           "code": "import heapq\r\nfrom math import inf\r\ndef sort_items(xs):\r\n    import os\r\n    return sorted(xs)",
           "test_list": ["assert sort_items([2, 1]) == [1, 2]", "assert sort_items([]) == []", "assert callable(sort_items)"]}
    assert mbpp_stub(row, every_test=True) == (
        'import heapq\nfrom math import inf\n\n\ndef sort_items(xs):\n    """ Write a function to sort items.\n'
        '    >>> sort_items([2, 1])\n    [1, 2]\n    >>> sort_items([])\n    []\n    """\n')
    assert mbpp_stub(row).count(">>>") == 1 and not mbpp_stub(row).startswith("import")


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


def test_stdlib_stubs_keep_documented_public_functions_and_methods_and_skip_tests_and_broken_files(tmp_path):
    long_doc = "\n".join(f"line {i} of the docstring" for i in range(STUB_DOC_LINES + 5))
    (tmp_path / "mod.py").write_text(
        "import os\n\n@decorated\ndef scale(xs: list[int], k: int = 2) -> list[int]:\n"
        "    \"\"\"Scale every item by k.\n\n    >>> scale([1], 3)\n    [3]\n    \"\"\"\n    return [x * k for x in xs]\n\n"
        "def _private(x):\n    \"\"\"A private helper is no stub.\"\"\"\n\n"
        "def terse(x):\n    \"\"\"Too short.\"\"\"\n\n"
        "def undocumented(x):\n    return x\n\n"
        "def digits(s):\n    r\"\"\"Match every \\d+ run in s.\"\"\"\n\n"
        f"def long(x):\n    \"\"\"First paragraph of four words.\n\n{long_doc}\n    \"\"\"\n\n"
        "class Box:\n    def open(self, force=False):\n        \"\"\"Open the box, even when stuck.\"\"\"\n"
        "    def _close(self):\n        \"\"\"Close the box when done.\"\"\"\n")
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text("def check(x):\n    \"\"\"A test module is never a source.\"\"\"\n")
    (tmp_path / "broken.py").write_text("print 'python 2'\n")
    scale, digits, long = stdlib_stubs(methods=False, root=tmp_path)
    assert scale == ('def scale(xs: list[int], k: int=2) -> list[int]:\n    """ Scale every item by k.\n\n'
                     '    >>> scale([1], 3)\n    [3]\n    """\n')
    assert digits == 'def digits(s):\n    r""" Match every \\d+ run in s.\n    """\n'  # raw, as its source
    assert long == 'def long(x):\n    """ First paragraph of four words.\n    """\n'  # cut at the last paragraph break
    assert stdlib_stubs(methods=True, root=tmp_path) == [
        'class Box:\n    def open(self, force=False):\n        """ Open the box, even when stuck.\n        """\n']


def test_every_stdlib_stub_is_python_whose_function_has_a_docstring():
    for methods in (False, True):
        stubs = stdlib_stubs(methods)
        assert len(stubs) > 1000 and len(set(stubs)) == len(stubs)
        for stub in stubs:
            node = ast.parse(stub).body[-1]
            fn = node.body[0] if methods else node
            assert isinstance(fn, ast.FunctionDef) and ast.get_docstring(fn), stub
