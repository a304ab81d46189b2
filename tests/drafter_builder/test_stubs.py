"""HumanEval-style stubs: an MBPP task becomes a stub of the function its test calls (or
of every test, with the solution's imports); the standard library yields stubs of its
documented public functions and methods, and nothing else."""

from __future__ import annotations

import ast

from drafter_builder.stubs import STUB_DOC_LINES, mbpp_stub, stdlib_stubs


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
