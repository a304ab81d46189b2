"""HumanEval-style function stubs (signature + docstring) built from permissive sources.

A stub is answered with bare code, the shape of a HumanEval answer. Three sources:
MBPP training tasks (`mbpp_stub`), GSM8K train questions (`gsm8k_stub`: one signature),
and the documented public functions and methods of the interpreter's standard library
(`stdlib_stubs`: varied real signatures).
"""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path
from typing import Any

_ASSERT_EQ = re.compile(r"^assert\s+(.+?)\s*==\s*(.+)$")


def mbpp_stub(row: dict[str, Any], every_test: bool = False) -> str | None:
    """An MBPP task as a HumanEval-style prompt: the signature of the tested function of
    the reference solution and a docstring holding the task text and its first test as a
    doctest. None when the solution defines no such top-level function.

    `every_test` (pool `mbpp_doctest`) writes every `assert f(..) == y` test as a
    doctest and opens with the solution's top-level imports, as HumanEval stubs do.
    """
    asserts = row["test_list"] if every_test else row["test_list"][:1]
    tests = [m for m in (_ASSERT_EQ.match(t.strip()) for t in asserts) if m is not None]
    called = re.match(r"\s*(\w+)\s*\(", tests[0].group(1)) if tests else None
    lines = [ln.rstrip() for ln in row["code"].splitlines()]
    defs = [ln for ln in lines if ln.startswith("def ")]
    if called is not None:
        defs = [ln for ln in defs if re.match(rf"def\s+{re.escape(called.group(1))}\s*\(", ln)]
    if not defs:
        return None
    signature, doc = defs[0], row["text"].strip()
    for test in tests:
        doc += f"\n    >>> {test.group(1)}\n    {test.group(2)}"
    imports = [ln for ln in lines if ln.startswith(("import ", "from "))] if every_test else []
    head = "\n".join(imports) + "\n\n\n" if imports else ""
    return f'{head}{signature}\n    """ {doc}\n    """\n'


def gsm8k_stub(question: str) -> str:
    """A GSM8K question as a HumanEval-style stub (pool `gsm8k_stub`): the target answers
    a stub with bare code, the shape of a HumanEval answer, on a permissive pool larger
    than MBPP's 463 training tasks."""
    return f'def solution() -> int:\n    """ {question.strip()}\n    Return the final answer.\n    """\n'


_STDLIB_SKIP = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "tkinter", "unittest"}
STUB_DOC_LINES = 20


def _stub_doc(doc: str, indent: str) -> str:
    """A docstring as a stub writes it: its first paragraphs up to STUB_DOC_LINES lines."""
    lines = doc.splitlines()
    if len(lines) > STUB_DOC_LINES:
        breaks = [i for i, ln in enumerate(lines[:STUB_DOC_LINES]) if not ln.strip()]
        lines = lines[: breaks[-1] if breaks else STUB_DOC_LINES]
    body = "\n".join(indent + ln if ln.strip() else "" for ln in lines).lstrip()
    raw = "r" if "\\" in body else ""  # the source wrote a backslash in a raw docstring
    return f'{indent}{raw}""" {body}\n{indent}"""\n'


def _stubs(nodes: list[ast.stmt], indent: str = "") -> list[str]:
    """Stubs of the public functions among `nodes` whose docstring a stub can hold (4+ words, no triple quote)."""
    out = []
    for fn in nodes:
        doc = ast.get_docstring(fn) if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") else None
        if doc is None or len(doc.split()) < 4 or '"""' in doc:
            continue
        head = ast.FunctionDef(name=fn.name, args=fn.args, body=[ast.Pass()], decorator_list=[], returns=fn.returns,
                               type_comment=None, type_params=[])
        signature = ast.unparse(ast.fix_missing_locations(head)).rsplit("\n", 1)[0]
        out.append(f"{indent}{signature}\n" + _stub_doc(doc, indent + "    "))
    return out


def stdlib_stubs(methods: bool, root: Path | None = None) -> list[str]:
    """HumanEval-style stubs (signature + docstring) of the documented public functions of the
    interpreter's standard library (PSF-2.0), in file order: varied real signatures, which the
    MBPP (463 tasks) and GSM8K (one signature) stubs lack. `methods`: public methods instead,
    each as a stub inside its `class` line. Tests, IDLE, lib2to3, tkinter and third-party
    packages are left out; the pool is fixed by the Python minor version."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out: dict[str, None] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _STDLIB_SKIP or part.startswith(("config-", "__pycache__")) for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a test fixture or a file in another encoding: not a stub source
        if not methods:
            out.update(dict.fromkeys(_stubs(tree.body)))
            continue
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
                out.update(dict.fromkeys(f"class {cls.name}:\n" + stub for stub in _stubs(cls.body, "    ")))
    return list(out)
