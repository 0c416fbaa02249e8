"""Turn a vLLM server's own request log into a trace (`python -m specflow.workloads.convert`).

vLLM logs each request's JSON body when it runs with `--enable-log-requests` and its request
logger at DEBUG (docs/traces.md gives the logging config that raises only that logger), and,
for chat requests with `--enable-log-outputs`, each response's output token ids. A line

    ... DEBUG 2026-12-07T04:11:03 [request_logger.py:75] Request cmpl-1 JSON body: {...}

becomes `{"request": {...}, "timestamp": "...", "request_id": "cmpl-1"}`, with `output_tokens`
where a `Generated response <id> details: output_token_ids: [...]` line gives the length. A body
vLLM cut at `--max-log-len` is not JSON and is reported by line. Completion bodies hold the
prompt vLLM received (already rendered; replayed as it is); chat bodies hold `messages`.
Gateways that log JSON (LiteLLM, an OpenAI-compatible proxy, OpenAI batch files with `body`)
need no converter: name their fields with the trace source's dotted paths.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from specflow.spec.errors import Problem, SpecError, report

LOGGING = Path(__file__).with_name("vllm_request_logging.json")
"""vLLM's logging config with only the request logger at DEBUG and ISO time stamps:
`VLLM_LOGGING_CONFIG_PATH=<this file> vllm serve ... --enable-log-requests`."""

BODY = re.compile(r"Request (?P<id>\S+) JSON body: (?P<body>\{.*)$")
OUTPUT = re.compile(r"Generated response (?P<id>\S+?)(?: \(streaming complete\))? details: "
                    r"output_token_ids: \[(?P<ids>[^\]]*)\]")
PREFIX = re.compile(r"^(?:chatcmpl|cmpl|resp)-")
"""What vLLM's endpoints put before the request's own id in a response's id."""
STAMP = re.compile(r"(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?)|"
                   r"(?P<short>\b\d\d-\d\d \d\d:\d\d:\d\d)")
"""A line's time: ISO 8601 (the documented logging config), or vLLM's default `%m-%d %H:%M:%S`
(the year taken as `year`)."""


def _stamp(line: str, year: int) -> str | None:
    m = STAMP.search(line)
    if m is None:
        return None
    if m["iso"]:
        return m["iso"].replace(" ", "T")
    return dt.datetime.strptime(f"{year}-{m['short']}", "%Y-%m-%d %H:%M:%S").isoformat()


def vllm_log(lines: Iterable[str], where: str = "log", year: int | None = None
             ) -> Iterator[dict[str, Any]]:
    """The trace lines of a vLLM server log; SpecError (after reading it all) for bodies that
    are not JSON."""
    year = year or dt.datetime.now(dt.UTC).year
    found: list[dict[str, Any]] = []
    lengths: dict[str, int] = {}
    problems: list[Problem] = []
    for n, line in enumerate(lines, 1):
        body = BODY.search(line)
        if body is not None:
            try:
                request = json.loads(body["body"])
            except json.JSONDecodeError as exc:
                problems.append(Problem(f"{where}:{n}", "a request body that is not JSON (cut "
                                        "at --max-log-len?)", f"{exc.msg} at column {exc.colno}",
                                        "the whole body: run vLLM without --max-log-len"))
                continue
            row = {"request": request, "request_id": body["id"]}
            stamp = _stamp(line[:body.start()], year)
            if stamp:
                row["timestamp"] = stamp
            found.append(row)
            continue
        out = OUTPUT.search(line)
        if out is not None:  # the response's id is the body's with the endpoint's prefix
            rid = PREFIX.sub("", out["id"])
            lengths[rid] = len([x for x in out["ids"].split(",") if x.strip()])
    if problems:
        raise SpecError(problems)
    for row in found:
        rid = PREFIX.sub("", row["request_id"])
        if rid in lengths:
            row["output_tokens"] = lengths[rid]
        yield row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specflow.workloads.convert",
                                 description="Write a vLLM server log's requests as a trace "
                                             "(JSONL, one request per line).")
    ap.add_argument("kind", choices=["vllm-log"], help="what the input is")
    ap.add_argument("log", help="the server's log file")
    ap.add_argument("-o", "--out", help="the trace to write (default: stdout)")
    ap.add_argument("--year", type=int, help="the year of vLLM's default time stamps (%%m-%%d)")
    a = ap.parse_args(argv)
    path = Path(a.log)
    try:
        if not path.is_file():
            raise SpecError([Problem(a.log, "no such file", a.log, "a vLLM server log")])
        with path.open(encoding="utf-8", errors="replace") as fh:
            rows = list(vllm_log(fh, str(path), a.year))
    except SpecError as exc:
        return report(exc, sys.stderr)
    if not rows:
        return report(SpecError([Problem(str(path), "holds no request bodies", 0, "a log of "
                                         "vLLM run with --enable-log-requests and its request "
                                         f"logger at DEBUG (VLLM_LOGGING_CONFIG_PATH={LOGGING})")]),
                      sys.stderr)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if a.out:
        Path(a.out).write_text(text, encoding="utf-8")
        sys.stderr.write(f"{len(rows)} requests -> {a.out}\n")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
