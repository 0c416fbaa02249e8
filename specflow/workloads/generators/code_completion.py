"""Code completion: the code before a cut inside a function of this interpreter's own stdlib
sources (about `input_len` tokens of the file); the rest of the function is the reference."""

from __future__ import annotations

import ast
import functools
import os
import random
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from specflow.spec.errors import Problem
from specflow.spec.schema import WorkloadSpec
from specflow.workloads.model import Example, Fail
from specflow.workloads.tokens import token_length

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "encodings",
              "site-packages", "dist-packages", "__pycache__", "pydoc_data", "config-3"}

Function = tuple[int, int, list[int]]
"""(def line, end line, body statement lines), 1-based."""


@functools.cache
def _stdlib_files() -> tuple[tuple[str, Path], ...]:
    """(relative path, path) of this interpreter's stdlib .py files, sorted (no tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP_DIRS and not d.startswith(("config-", ".")))
        for f in filenames:
            if f.endswith(".py"):
                path = Path(dirpath) / f
                out.append((path.relative_to(root).as_posix(), path))
    return tuple(sorted(out))


def _function(node: ast.AST) -> Function | None:
    """A function worth cutting into: two statements and three lines after its docstring."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # cut after the docstring at the earliest
    if len(body) < 2 or node.end_lineno - body[0].lineno < 3:
        return None
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return start, node.end_lineno, [s.lineno for s in body]


@functools.lru_cache(maxsize=64)
def _functions(path: Path) -> tuple[list[str], list[Function]]:
    """A file's lines and its functions worth cutting into."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return [], []
    funcs = [f for f in map(_function, ast.walk(tree)) if f is not None]
    return text.splitlines(keepends=True), funcs


def _pick_file(rng: random.Random) -> tuple[str, list[str], list[Function]]:
    """A stdlib file that holds functions: (relative path, lines, functions)."""
    files = _stdlib_files()
    for _ in range(1000 if files else 0):
        rel, path = rng.choice(files)
        lines, funcs = _functions(path)
        if funcs:
            return rel, lines, funcs
    raise Fail(Problem("source.generator", "no Python functions found in the stdlib sources",
                       sysconfig.get_paths()["stdlib"],
                       "an interpreter that ships its stdlib as .py files"))


def generate(rng: random.Random, spec: WorkloadSpec, tok: Tokenizer | None) -> Example:
    """The code before a cut inside a stdlib function (about `input_len` tokens); the rest of
    the function is the reference completion."""
    rel, lines, funcs = _pick_file(rng)
    start, end, stmts = rng.choice(funcs)
    cut = rng.choice(stmts[: max(1, len(stmts) // 2)]) - 1  # 0-based first line of the answer
    header = f"# {rel}\n"
    budget = spec.input_len - token_length(tok, header)
    first = cut
    while first > 0:
        cost = token_length(tok, lines[first - 1])
        if budget - cost < 0 and first <= start - 1:
            break
        budget -= cost
        first -= 1
    return Example(header + "".join(lines[first:cut]), "".join(lines[cut:end]))
