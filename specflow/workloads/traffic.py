"""What a request log holds, before anything runs (`python -m specflow traffic TRACE`): its
classes with their requests and shares, input and output lengths, turns, tool use, time span and
request rate; problems by file:line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specflow.spec.errors import Problem, SpecError
from specflow.spec.schema import TraceSource, WorkloadSpec
from specflow.spec.traces import Request, Trace, read_trace
from specflow.workloads.model import Example
from specflow.workloads.rendering import render
from specflow.workloads.tokens import CHARS_PER_TOKEN, load_tokenizer, token_ids

if TYPE_CHECKING:
    from rich.console import Console

QUANTILES = (50, 90, 99)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """{"p50", "p90", "p99", "mean"} of `values`; empty when there are none."""
    if not values:
        return {}
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {**{f"p{q}": float(np.percentile(arr, q)) for q in QUANTILES},
            "mean": float(arr.mean())}


def _input_tokens(reqs: Sequence[Request], src: TraceSource, tokenizer: Any) -> list[float]:
    if tokenizer is None:
        return [r.text_chars() / CHARS_PER_TOKEN for r in reqs]
    spec = WorkloadSpec(traffic_class="trace", source=src)
    return [float(len(token_ids(tokenizer, render("trace", spec, (), Example("", request=r),
                                                   tokenizer)))) for r in reqs]


def _span(reqs: Sequence[Request]) -> dict[str, float]:
    times = sorted(r.timestamp for r in reqs if r.timestamp is not None)
    if len(times) < 2 or times[-1] <= times[0]:
        return {}
    span = times[-1] - times[0]
    return {"span_s": span, "rate_per_s": (len(times) - 1) / span}


def _class_summary(reqs: Sequence[Request], total: int, src: TraceSource, tokenizer: Any
                   ) -> dict[str, Any]:
    recorded = [float(r.recorded_output) for r in reqs if r.recorded_output is not None]
    limits = [float(r.max_tokens) for r in reqs if r.max_tokens is not None]
    return {
        "requests": len(reqs), "share": len(reqs) / total if total else 0.0,
        "input_tokens": percentiles(_input_tokens(reqs, src, tokenizer)),
        "output_tokens": percentiles(recorded),
        "with_recorded_output": len(recorded) / len(reqs) if reqs else 0.0,
        "max_tokens": percentiles(limits),
        "turns": percentiles([float(r.turns) for r in reqs]),
        "tool_use": sum(r.uses_tools for r in reqs) / len(reqs) if reqs else 0.0,
        "chat": sum(r.messages is not None for r in reqs) / len(reqs) if reqs else 0.0,
        **_span(reqs),
    }


def summarize(trace: Trace, src: TraceSource, tokenizer: str | None = None,
              num_prompts: int | None = None) -> dict[str, Any]:
    """The trace's summary (JSON-able). Raises SpecError with every problem: its lines', and
    each class smaller than `num_prompts`."""
    problems = trace.all_problems()
    by_class: dict[str, list[Request]] = {}
    for r in trace.requests:
        by_class.setdefault(r.traffic_class or "(no class)", []).append(r)
    if num_prompts is not None:
        problems += [Problem(str(trace.path), f"class '{c}' holds fewer requests than a window "
                             "sends", len(reqs), f"at least num_prompts ({num_prompts}), or "
                             "source.classes without it", source="--num-prompts")
                     for c, reqs in sorted(by_class.items()) if len(reqs) < num_prompts]
    if problems:
        raise SpecError(problems)
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    total = len(trace.requests)
    return {
        "file": str(trace.path), "requests": total,
        "tokens": "counted with the tokenizer" if tok is not None
        else f"estimated (chars / {CHARS_PER_TOKEN})",
        **_span(trace.requests),
        "classes": {c: _class_summary(reqs, total, src, tok)
                    for c, reqs in sorted(by_class.items(), key=lambda kv: -len(kv[1]))},
    }


def _q(p: dict[str, float], digits: int = 0) -> str:
    if not p:
        return "-"
    return "/".join(f"{p[f'p{q}']:.{digits}f}" for q in QUANTILES)


def print_summary(s: dict[str, Any], out: Console) -> None:
    """The summary as a table (percentiles p50/p90/p99)."""
    from rich.table import Table

    rate = (f", {s['span_s']:.0f} s, {s['rate_per_s']:.2f} req/s" if "span_s" in s else
            ", no timestamps")
    table = Table(title=f"{s['file']}: {s['requests']} requests{rate}; tokens "
                        f"{s['tokens']}; p50/p90/p99", title_justify="left", expand=False)
    for col in ("class", "requests", "share", "input tokens", "output tokens (log)",
                "max_tokens", "turns", "tool use", "req/s"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for name, c in s["classes"].items():
        out_tokens = _q(c["output_tokens"])
        if c["output_tokens"] and c["with_recorded_output"] < 1:
            out_tokens += f" ({c['with_recorded_output']:.0%} logged)"
        table.add_row(name, str(c["requests"]), f"{c['share']:.1%}", _q(c["input_tokens"]),
                      out_tokens, _q(c["max_tokens"]), _q(c["turns"]), f"{c['tool_use']:.0%}",
                      f"{c['rate_per_s']:.2f}" if "rate_per_s" in c else "-")
    out.print(table)


def load(path: str, class_field: str | None, fmt: str = "openai") -> tuple[Trace, TraceSource]:
    """The trace and the source it was read as; SpecError for a bad option."""
    from pydantic import ValidationError

    try:
        src = TraceSource(path=path, class_field=class_field, format=fmt)  # type: ignore[arg-type]
    except ValidationError as exc:
        fields = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        problems = []
        if "format" in fields:
            problems.append(Problem("--format", "unknown trace format", fmt,
                                    "one of ['openai', 'spec_bench', 'speed_bench']"))
        if "class_field" in fields:
            problems.append(Problem("--class-field", "an empty path", class_field,
                                    "a dotted path (metadata.route)"))
        if "path" in fields:
            problems.append(Problem("traffic", "an empty file name", path, "a request log"))
        raise SpecError(problems) from None
    return read_trace(path, src), src
