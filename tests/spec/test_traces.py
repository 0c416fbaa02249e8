"""Request logs (`specflow.spec.traces`) and the workloads a trace and a service become
(`specflow.spec.expand`): the shapes gateways log, and every problem by file:line, all at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specflow.config.compose import load
from specflow.spec.errors import SpecError
from specflow.spec.schema import MixSource, TraceSource
from specflow.spec.traces import MAX_PROBLEMS, read_trace

CHAT = {"messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "list the files"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function",
                          "function": {"name": "ls", "arguments": "{\"dir\": \".\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
                     {"role": "user", "content": [{"type": "text", "text": "and "},
                                                  {"type": "text", "text": "now?"}]}],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}],
        "max_completion_tokens": 300}


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_the_shapes_gateways_log_are_read_as_they_are(tmp_path: Path) -> None:
    """Top-level and nested (`request` / `body`) bodies, usage beside them or under
    `response`, a completion prompt, ISO and millisecond timestamps, a dotted class field."""
    rows = [
        {**CHAT, "usage": {"completion_tokens": 120}, "timestamp": "2026-12-01T10:00:00Z",
         "metadata": {"route": "support-bot"}},
        {"request": CHAT, "response": {"usage": {"completion_tokens": 80}},
         "timestamp": 1796119201000, "metadata": {"route": "support-bot"}},
        {"body": {"prompt": "def f(x):", "max_tokens": 16}, "output_tokens": 9,
         "timestamp": 1796119202.5, "metadata": {"route": "sql_agent2"}},
    ]
    src = TraceSource(path=str(tmp_path / "t.jsonl"), class_field="metadata.route")
    trace = read_trace(_write(tmp_path / "t.jsonl", rows), src)
    assert trace.problems == []
    a, b, c = trace.requests
    assert (a.traffic_class, a.recorded_output, a.max_tokens, a.turns) == ("support-bot", 120,
                                                                          300, 5)
    assert a.uses_tools and a.messages is not None and a.messages[-1]["content"] == "and now?"
    assert a.messages[2]["content"] == "" and a.messages[2]["tool_calls"]  # a tool call's turn
    assert (b.recorded_output, b.timestamp) == (80, 1796119201.0)  # milliseconds
    assert a.timestamp == 1796119200.0 and a.key == b.key  # one request, twice
    assert (c.prompt, c.messages, c.max_tokens, c.recorded_output, c.traffic_class) == (
        "def f(x):", None, 16, 9, "sql_agent2")
    assert not c.uses_tools and c.output_len(cap=4) == 4 and a.output_len(cap=4096) == 120


def test_every_problem_of_a_log_is_named_by_file_and_line_at_once(tmp_path: Path) -> None:
    rows: list[object] = [
        {"messages": [{"role": "user", "content": "ok"}], "class": "a"},
        "{not json",
        {"messages": [{"role": "wizard", "content": "hi"}], "class": "a"},
        {"prompt": "", "class": "a"},
        {"metadata": {}, "class": "a"},
        {"messages": [{"role": "user", "content": "x"}], "class": ""},
        {"messages": [{"role": "user", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}], "class": "a"},
        {"messages": [{"role": "user", "content": "x"}], "class": "a", "max_tokens": -3},
        [1, 2],
    ]
    path = _write(tmp_path / "bad.jsonl", rows)
    trace = read_trace(path, TraceSource(path=str(path), class_field="class"))
    lines = [p.render() for p in trace.problems]
    assert [p.path for p in trace.problems] == [f"{path}:{n}" for n in range(2, 11)], lines
    said = "\n".join(lines)
    for words in ("is not valid JSON", "unknown role; got 'wizard'; expected one of ['system',",
                  "is not a prompt", "has no messages and no prompt", "is not a class name",
                  "has no class", "content that is not text", "is not a token count",
                  "is not a JSON object"):
        assert words in said, said
    assert len(trace.requests) == 1


@pytest.mark.parametrize("content, says", [
    (b"", "holds no requests"),
    (b"\x00\x00\x00\rIHDR\x89PNG\r\n", "is not text (a binary file?)"),
    (b"\x89PNG\r\n\x1a\n", "is not UTF-8 text (a binary file?)"),
])
def test_an_empty_or_binary_file_is_one_clear_problem(tmp_path: Path, content: bytes,
                                                       says: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    (problem,) = read_trace(path, TraceSource(path=str(path))).problems
    assert says in problem.render() and str(path) in problem.path


def test_a_log_full_of_problems_lists_the_first_and_counts_the_rest(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", ["{"] * (MAX_PROBLEMS + 7))
    trace = read_trace(path, TraceSource(path=str(path)))
    problems = trace.all_problems()
    assert len(problems) == MAX_PROBLEMS + 1 and "7 more problems" in problems[-1].render()


def test_the_benchmark_formats_replay_each_questions_first_turn(tmp_path: Path) -> None:
    spec_bench = _write(tmp_path / "question.jsonl", [
        {"question_id": 1, "category": "translation", "turns": ["Translate: hola", "again"]},
        {"question_id": 2, "category": "math_reasoning", "turns": ["1+1?"]}])
    trace = read_trace(spec_bench, TraceSource(path=str(spec_bench), format="spec_bench"))
    assert [(r.traffic_class, r.messages) for r in trace.requests] == [
        ("translation", ({"role": "user", "content": "Translate: hola"},)),
        ("math_reasoning", ({"role": "user", "content": "1+1?"},))]
    speed = _write(tmp_path / "qualitative.jsonl", [
        {"category": "coding", "messages": [{"role": "user", "content": "write a sort"},
                                            {"role": "user", "content": "faster"}]},
        {"category": "rag", "turns": ["FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE "
                                      "USING SPECDEC_BENCH"]}])
    trace = read_trace(speed, TraceSource(path=str(speed), format="speed_bench"))
    assert trace.requests[0].messages == ({"role": "user", "content": "write a sort"},)
    (problem,) = trace.problems
    assert problem.path == f"{speed}:2" and "placeholder" in problem.render()


def _demo_trace(tmp: Path, per_class: int = 24) -> Path:
    from specflow.demo import traces

    return traces.write(tmp / "trace.jsonl", per_class=per_class)


def test_a_trace_splits_into_a_workload_per_class_and_a_service_takes_its_shares(
        tmp_path: Path) -> None:
    trace = _demo_trace(tmp_path)
    loaded = load(["experiment=cpu_demo", "workload=[trace]",
                   f"workload.trace.source.path={trace}", "workload.trace.num_prompts=16",
                   "service=[shared]", "service.shared.num_prompts=32"])
    w = loaded.spec.workload
    assert list(w) == ["router", "sql-agent", "shared"]
    assert (w["router"].traffic_class, w["router"].source.classes) == ("router", ["router"])
    src = w["shared"].source
    assert isinstance(src, MixSource) and src.parts == {"router": 0.5, "sql-agent": 0.5}
    assert w["shared"].traffic_class == "shared" and w["shared"].num_prompts == 32
    # stated shares; existing class names keep working beside free-form ones
    stated = load(["experiment=cpu_demo", "service=[assistant]"]).spec.workload["assistant"]
    assert stated.source == MixSource(parts={"code_completion": 0.5, "classify": 0.5})


@pytest.mark.parametrize("overrides, says", [
    (["workload.trace.num_prompts=30"], [
        "workload.trace.num_prompts: more prompts than class 'router' of",
        "workload.trace.num_prompts: more prompts than class 'sql-agent' of"]),
    (["workload.trace.source.classes=[router,sql-agnet]"], [
        "workload.trace.source.classes: no request of the trace is of this class; got "
        "'sql-agnet'; expected one of ['router', 'sql-agent']; did you mean 'sql-agent'?"]),
    (["workload.trace.traffic_class=null", "workload.trace.source.class_field=null"], [
        "workload.trace.traffic_class: a workload needs a class"]),
    (["workload.trace.traffic_class='sql agent'"], [
        "workload.trace.traffic_class: malformed; got 'sql agent'; expected a name of letters, "
        "digits, '_' and '-' starting with a letter"]),
    (["service=[shared,assistant]"], [
        "service.assistant.classes: no such workload; got 'code_completion'"]),
    (["workload.trace.source.path=missing.jsonl"], [
        "missing.jsonl: no such file; got 'missing.jsonl'; expected an existing JSONL request "
        "log [workload.trace.source.path]"]),
])
def test_a_bad_trace_workload_or_service_is_refused_naming_it(
        tmp_path: Path, overrides: list[str], says: list[str]) -> None:
    trace = _demo_trace(tmp_path)
    with pytest.raises(SpecError) as info:
        load(["experiment=cpu_demo", "workload=[trace]", f"workload.trace.source.path={trace}",
              "workload.trace.num_prompts=16", "service=[shared]",
              "service.shared.num_prompts=32", *overrides])
    said = info.value.render()
    for words in says:
        assert words in said, said


def test_speed_bench_parquet_is_read_as_the_hub_ships_it(tmp_path: Path) -> None:
    """SPEED-Bench's parquet columns (question_id, category, turns, ...), one row a question."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "qualitative.parquet"
    pq.write_table(pa.table({"question_id": [1, 2], "category": ["coding", "stem"],
                             "turns": [["write a parser", "now test it"], ["why is the sky"]],
                             "multiturn": [True, False]}), path)
    trace = read_trace(path, TraceSource(path=str(path), format="speed_bench"))
    assert trace.problems == []
    assert [(r.line, r.traffic_class, r.messages) for r in trace.requests] == [
        (1, "coding", ({"role": "user", "content": "write a parser"},)),
        (2, "stem", ({"role": "user", "content": "why is the sky"},))]


def test_template_arguments_the_renderer_sets_are_refused_by_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [
        {"messages": [{"role": "user", "content": "x"}],
         "chat_template_kwargs": {"add_generation_prompt": False, "enable_thinking": False}},
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "yes"}])
    trace = read_trace(path, TraceSource(path=str(path)))
    assert [p.path for p in trace.problems] == [f"{path}:1", f"{path}:2"]
    assert "sets what the renderer sets; got [\"add_generation_prompt\"]" in \
        trace.problems[0].render()


def test_a_trace_is_pinned_to_its_content_and_names_collide_loudly(tmp_path: Path) -> None:
    """The file's sha256 is part of the workload (a log replaced in place is another sweep);
    a stated one the file does not have is refused. A service named like a traffic class, a
    mix of itself, a service of fewer requests than classes: refused, naming them."""
    from specflow.spec.expand import expand
    from specflow.spec.schema import ServiceSpec, WorkloadSpec

    trace = _demo_trace(tmp_path)
    base = ["experiment=cpu_demo", "workload=[trace]", f"workload.trace.source.path={trace}",
            "workload.trace.num_prompts=16"]
    digest = load(base).spec.workload["router"].source.sha256
    assert digest is not None and len(digest) == 64
    with trace.open("a") as fh:
        fh.write(json.dumps({"messages": [{"role": "user", "content": "new"}],
                             "metadata": {"route": "router"}}) + "\n")
    assert load(base).spec.workload["router"].source.sha256 != digest
    with pytest.raises(SpecError) as info:
        load([*base, f"+workload.trace.source.sha256={digest}"])
    assert "the file changed since it was pinned" in info.value.render()
    spec = load(["experiment=cpu_demo"]).spec
    cases = {
        "service.code: a service has the name of a traffic class": {"service": {
            "code": ServiceSpec(classes={"code_completion": 1, "classify": 1})}},
        "service.both.num_prompts: fewer requests than classes": {"service": {
            "both": ServiceSpec(classes={"code_completion": 1, "classify": 1},
                                num_prompts=2).model_copy(update={"num_prompts": 1})}},
        "workload.mine.source.parts: not a workload to mix; got 'mine'": {"workload": {
            **spec.workload, "mine": WorkloadSpec(traffic_class="mine", source={
                "kind": "mix", "parts": {"mine": 1, "classify": 1}})}},
    }
    for says, update in cases.items():
        with pytest.raises(SpecError) as info:
            expand(spec.model_copy(update=update))
        assert says in info.value.render(), info.value.render()
