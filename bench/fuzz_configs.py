"""Fuzz the configuration surface: random override sets and broken YAML files through the CLI.

Run: .venv/bin/python bench/fuzz_configs.py [--overrides 1000] [--yaml 60] [--seed 0] [--smoke]
(--smoke: 8 override sets and 2 broken YAML files, seconds; tests/config/test_fuzz.py runs a
larger seeded slice in-process)

Override sets are drawn over the real conf key space (every leaf of every group's entries):
wrong types, out of range, inf/nan, unknown keys and entries, list vs scalar, additions and
deletions, garbage text, group selections. Broken YAML files are copies of conf/ with one file
damaged (a tab, a bad indent, an unclosed bracket, a duplicate key, a python tag, binary junk,
a truncation). Each case runs `specflow compile --no-vllm-check` or `specflow headroom` in-process
through `cli.main` and is classified:

  clean       exit 0, or exit 2 with "invalid configuration: N problems" and N lines that each
              name a dotted field, an override or a file:line, or headroom's refusal (its fit)
  unclear     exit 2 whose lines do not name a field or file:line
  traceback   an exception escaped cli.main
  other_exit  any other exit code

Target: clean == total. The last line is one JSON object with the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from specflow import cli
from specflow.config.compose import conf_dir, options
from specflow.config.validation import GROUPS, MULTI

_LINE = re.compile(r"^  - (override '.*'|[\w.\-\[\]/]+(:\d+:\d+)?|conf/[\w./\-]+(:\d+)?(:\d+)?): ")
_HEAD = re.compile(r"^invalid configuration: (\d+) problems?$")
_SCALARS = ["abc", "''", "null", "true", "-1", "0", "1", "1.5", "-0.5", "1e9", "1e308", "inf",
            "-inf", "nan", "[]", "[1,2]", "{}", "{a: 1}", "'x y'", "${nope}", "???", "[[1,2]]"]
_GARBAGE = "ab=.[]{}+~$@:,' \"\\\n\t/"


def leaves(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted paths of every leaf (lists count as leaves) of a composed mapping."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, data


def key_space(root: Path) -> list[str]:
    """Every leaf key of every group entry, as the user would address it."""
    keys: set[str] = set()
    for group in GROUPS:
        if group == "experiment":
            continue
        for name in options(group, root):
            data = yaml.safe_load((root / group / f"{name}.yaml").read_text()) or {}
            data.pop("defaults", None)
            base = f"{group}.{name}" if group in MULTI else group
            inner = data.get(name, data) if group in MULTI else data
            keys.update(f"{base}.{k}" for k, _ in leaves(inner))
    top = yaml.safe_load((root / "config.yaml").read_text()) or {}
    top.pop("defaults", None)
    keys.update(k for k, _ in leaves(top))
    return sorted(k for k in keys if k)


def override(rng: random.Random, keys: list[str], root: Path) -> str:
    """One random override of one kind."""
    key = rng.choice(keys)
    kind = rng.randrange(9)
    if kind == 0:
        return f"{key}={rng.choice(_SCALARS)}"
    if kind == 1:
        return f"{key}={rng.choice(['-5', '0', '99999999', '1e12', '-1e-9'])}"
    if kind == 2:
        return f"{key}={rng.choice(['inf', 'nan', '-inf', '1e308', '1e400'])}"
    if kind == 3:
        return rng.choice([f"{key}x=1", f"+{key}.nope=1", f"+{key}_typo=2", f"++{key}x=3"])
    if kind == 4:
        return f"{key}={rng.choice(['[1]', '[a,b]', '5', 'x'])}"
    if kind == 5:
        return rng.choice([f"+{key}={rng.choice(_SCALARS)}", f"++{key}={rng.choice(_SCALARS)}"])
    if kind == 6:
        return f"~{key}"
    if kind == 7:
        return "".join(rng.choice(_GARBAGE) for _ in range(rng.randrange(1, 12)))
    group = rng.choice(GROUPS)
    names = options(group, root) + ["nope", "qwen3_8", "eagl3"]
    if group in MULTI and rng.random() < 0.6:
        return f"{group}=[{','.join(rng.sample(names, k=min(len(names), rng.randrange(0, 3))))}]"
    return f"{group}={rng.choice(names)}"


def classify(argv: list[str]) -> tuple[str, str]:
    """Run the CLI in-process; (outcome, evidence)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    except BaseException:  # noqa: BLE001 - what the fuzzer is looking for
        return "traceback", traceback.format_exc(limit=3)
    text = err.getvalue()
    if rc == 0:
        return "clean", ""
    if rc != 2:
        return "other_exit", f"rc={rc} {text[-300:]}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[-1].startswith("refused: "):
        return "clean", ""  # headroom's fit: the config is valid and does not fit
    head = _HEAD.match(lines[0]) if lines else None
    problems = [ln for ln in lines[1:] if ln.startswith("  - ")]
    if head and int(head.group(1)) == len(problems) == len(lines) - 1 and \
            all(_LINE.match(ln) for ln in problems):
        return "clean", ""
    return "unclear", text[-400:]


_BREAKERS = {
    "tab": lambda s: "\t" + s,
    "indent": lambda s: s.replace("\n", "\n   ", 1),
    "bracket": lambda s: s + "\nbroken: [1, 2\n",
    "duplicate": lambda s: s + "\n" + s.splitlines()[-1] + "\n" if s.strip() else "a: 1\na: 2\n",
    "python_tag": lambda s: s + "\nevil: !!python/object/apply:os.system ['true']\n",
    "binary": lambda s: s[: len(s) // 2] + "\x00\xff\xfe",
    "truncated": lambda s: s[: max(1, len(s) // 3)] + "{",
}


def broken_yaml(rng: random.Random, root: Path, tmp: Path) -> tuple[list[str], str]:
    """A copy of conf/ with one file damaged; the overrides that select it."""
    conf = tmp / "conf"
    shutil.rmtree(conf, ignore_errors=True)
    shutil.copytree(root, conf)
    group = rng.choice([g for g in GROUPS if options(g, conf)] + ["config"])
    if group == "config":
        path, select = conf / "config.yaml", []
    else:
        name = rng.choice(options(group, conf))
        path = conf / group / f"{name}.yaml"
        select = [f"{group}=[none,{name}]" if group == "drafter" else
                  f"{group}=[{name}]" if group in MULTI else f"{group}={name}"]
    how = rng.choice(sorted(_BREAKERS))
    path.write_text(_BREAKERS[how](path.read_text()), errors="surrogateescape")
    return select, f"{path.relative_to(tmp)}:{how}"


def run(n_overrides: int, n_yaml: int, seed: int) -> dict[str, Any]:
    """Fuzz; returns the counts per outcome and examples of anything not clean."""
    rng = random.Random(seed)
    root = conf_dir()
    keys = key_space(root)
    counts: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []

    def record(argv: list[str], what: str) -> None:
        outcome, evidence = classify(argv)
        counts[outcome] += 1
        if outcome != "clean" and len(examples) < 20:
            examples.append({"argv": argv, "case": what, "outcome": outcome,
                             "evidence": evidence})

    for _ in range(n_overrides):
        ovs = [override(rng, keys, root) for _ in range(rng.randrange(1, 5))]
        cmd = ["compile", "--no-vllm-check"] if rng.random() < 0.7 else ["headroom"]
        record([*cmd, *ovs], "overrides")
    old = os.environ.get("SPECFLOW_CONF")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for _ in range(n_yaml):
                select, what = broken_yaml(rng, root, Path(tmp))
                os.environ["SPECFLOW_CONF"] = str(Path(tmp) / "conf")
                record(["compile", "--no-vllm-check", *select], what)
        finally:
            if old is None:
                os.environ.pop("SPECFLOW_CONF", None)
            else:
                os.environ["SPECFLOW_CONF"] = old
    total = sum(counts.values())
    return {"total": total, "clean": counts["clean"], "unclear": counts["unclear"],
            "tracebacks": counts["traceback"], "other_exit": counts["other_exit"],
            "overrides": n_overrides, "yaml_files": n_yaml, "seed": seed,
            "examples": examples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overrides", type=int, default=1000)
    parser.add_argument("--yaml", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest: --overrides 8 --yaml 2")
    args = parser.parse_args()
    if args.smoke:
        args.overrides, args.yaml = 8, 2
    start = time.perf_counter()
    result = run(args.overrides, args.yaml, args.seed)
    elapsed = time.perf_counter() - start
    console = Console(highlight=False)
    table = Table(title=f"config fuzzing: {result['total']} cases in {elapsed:.0f} s")
    table.add_column("outcome")
    table.add_column("cases", justify="right")
    for key in ("clean", "unclear", "tracebacks", "other_exit"):
        table.add_row(key, str(result[key]))
    console.print(table)
    for ex in result["examples"][:10]:
        console.print(f"[yellow]{ex['outcome']}[/]: {ex['case']} {ex['argv']}", markup=True)
        console.print(ex["evidence"], markup=False)
    figures = {k: v for k, v in result.items() if k != "examples"}
    figures["seconds"] = round(elapsed, 1)
    sys.stdout.write(json.dumps(figures) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
