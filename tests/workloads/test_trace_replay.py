"""A trace materialised for `vllm bench serve`: each logged request rendered with the target's
chat template as the server would (system and tool turns, tools), its own output length, a
service's classes interleaved in their shares; and `python -m specflow traffic`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from specflow.cli import main
from specflow.config.compose import load
from specflow.demo import traces
from specflow.spec.errors import EXIT_INVALID
from specflow.workloads import materialize_all


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return traces.write(tmp_path_factory.mktemp("trace") / "trace.jsonl", per_class=24)


def _loaded(trace: Path, *extra: str):  # noqa: ANN202
    return load(["experiment=cpu_demo", "workload=[trace]", f"workload.trace.source.path={trace}",
                 "workload.trace.num_prompts=16", "service=[shared]",
                 "service.shared.num_prompts=32", *extra])


def test_a_trace_is_replayed_request_by_request(tiny_models: Path, trace: Path,
                                                tmp_path: Path) -> None:
    spec = _loaded(trace).spec
    done = materialize_all(spec.workload, tmp_path, str(tiny_models / "mimo_mtp2"), [4])
    logged = [json.loads(line) for line in trace.read_text().splitlines()]
    recorded = [(r.get("usage") or r.get("response", {}).get("usage"))["completion_tokens"]
                for r in logged]
    agent = done["sql-agent"]
    rows = [json.loads(line) for line in agent.path.read_text().splitlines()]
    assert len(rows) == agent.num_prompts == 16
    # the chat template rendered every turn: system, user, the tool call's turn, the tool's
    # result, the follow-up (its content parts joined), then the assistant's generation prompt
    first = rows[0]["prompt"]
    order = [first.index(t) for t in ("<|system|>\nYou are a coding agent", "<|user|>\nExplain",
                                      "<|assistant|>\n", "<|tool|>\n",
                                      "<|user|>\nNow rewrite it more simply.")]
    assert order == sorted(order) and first.endswith("<|assistant|>\n")
    # each request asks for the length it was answered with in the log (capped at max_tokens)
    assert [r["output_tokens"] for r in rows] == list(agent.output_lengths)
    assert set(agent.output_lengths) <= set(recorded) and len(set(agent.output_lengths)) > 3
    assert agent.recorded_output == agent.output_lengths and agent.private
    assert agent.max_tokens == max(agent.output_lengths)
    router = done["router"]
    assert set(router.output_lengths) <= {1, 2} and router.traffic_class == "router"
    # the service: 32 requests, half of each class (the trace's shares), interleaved
    shared = done["shared"]
    assert shared.num_prompts == 32 and Counter(shared.classes) == {"sql-agent": 16,
                                                                    "router": 16}
    assert shared.classes[:16].count("router") not in (0, 16)  # mixed, not one block each
    assert shared.private and len(shared.output_lengths) == 32
    # the same inputs, the same files (the hash names the prompts and their lengths)
    again = materialize_all(spec.workload, tmp_path, str(tiny_models / "mimo_mtp2"), [4])
    assert {n: m.prompt_hash for n, m in again.items()} == {n: m.prompt_hash
                                                           for n, m in done.items()}
    capped = materialize_all(_loaded(trace, "workload.trace.max_tokens=100").spec.workload,
                             tmp_path, str(tiny_models / "mimo_mtp2"), [4])["sql-agent"]
    assert max(capped.output_lengths) == 100 and capped.prompt_hash != agent.prompt_hash
    assert any("were answered with more tokens in the log" in w for w in capped.warnings)


def test_a_service_asking_more_of_a_class_than_it_holds_says_so(tiny_models: Path, trace: Path,
                                                                tmp_path: Path) -> None:
    from specflow.spec.errors import SpecError

    spec = _loaded(trace, "service.shared.num_prompts=64").spec
    with pytest.raises(SpecError) as info:
        materialize_all(spec.workload, tmp_path, str(tiny_models / "mimo_mtp2"))
    said = info.value.render()
    assert "service.shared.num_prompts: 32 of its 64 requests come from router" in said, said
    assert "[workload.router.num_prompts]" in said


def test_traffic_says_what_a_log_holds(trace: Path, tiny_models: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traffic", str(trace), "--class-field", "metadata.route"]) == 0
    table = capsys.readouterr().out
    assert "48 requests" in table and "req/s" in table and "estimated" in table
    assert "sql-agent" in table and "router" in table and "50.0%" in table
    assert main(["traffic", str(trace), "--class-field", "metadata.route", "--json",
                 "--tokenizer", str(tiny_models / "mimo_mtp2")]) == 0
    s = json.loads(capsys.readouterr().out)
    agent, router = s["classes"]["sql-agent"], s["classes"]["router"]
    assert (s["requests"], s["tokens"], agent["requests"], agent["share"]) == (
        48, "counted with the tokenizer", 24, 0.5)
    assert agent["tool_use"] == 1.0 and router["tool_use"] == 0.0
    assert agent["turns"]["p50"] == 5 and router["turns"]["p50"] == 1
    assert 96 <= agent["output_tokens"]["p50"] <= 192 and router["output_tokens"]["p99"] <= 2
    assert agent["input_tokens"]["mean"] > 4 * router["input_tokens"]["mean"]
    assert 1.0 < s["rate_per_s"] < 16.0 and s["span_s"] > 0


def test_traffic_names_every_problem_with_file_and_line(tmp_path: Path, trace: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "route": "a"}\n'
                   '{"messages": [\n'
                   '{"messages": [{"role": "robot", "content": "hi"}], "route": "a"}\n'
                   '{"route": "a"}\n'
                   '{"messages": [{"role": "user", "content": "hi"}], "route": ""}\n')
    assert main(["traffic", str(bad), "--class-field", "route"]) == EXIT_INVALID
    said = capsys.readouterr().err
    assert "Traceback" not in said
    for line, words in ((2, "is not valid JSON"), (3, "unknown role; got 'robot'"),
                        (4, "has no messages and no prompt"), (5, "is not a class name")):
        assert f"{bad}:{line}: '" in said or f"{bad}:{line}: {words}" in said, said
        assert words in said, said
    # a class too small for the windows a sweep would send
    assert main(["traffic", str(trace), "--class-field", "metadata.route",
                 "--num-prompts", "30"]) == EXIT_INVALID
    said = capsys.readouterr().err
    assert "class 'router' holds fewer requests than a window sends; got 24" in said
    assert main(["traffic", str(tmp_path / "none.jsonl")]) == EXIT_INVALID
    assert "no such file" in capsys.readouterr().err
    assert main(["traffic", str(trace), "--format", "csv"]) == EXIT_INVALID
    assert "--format: unknown trace format; got 'csv'" in capsys.readouterr().err


def test_a_hub_dataset_is_downloaded_only_when_asked(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default: the problem says how to supply it (or to ask for the download). Asked,
    the download is tried (here offline: the hub library's own refusal, as one problem line)."""
    import huggingface_hub.constants

    from specflow.spec.errors import SpecError
    from specflow.spec.schema import WorkloadSpec
    from specflow.workloads.sources import examples

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    spec = WorkloadSpec(traffic_class="chat", source={"kind": "hf", "dataset": "nvidia/SPEED-Bench",
                                                      "subset": "qualitative", "field": "turns"},
                        needs_hub=True)
    with pytest.raises(SpecError) as info:
        examples("speed", spec)
    assert "source.download=true to let specflow download it here" in info.value.render()
    asked = spec.model_copy(update={"source": spec.source.model_copy(update={"download": True})})
    with pytest.raises(SpecError) as info:
        examples("speed", asked)
    said = info.value.render()
    assert said.count("workload.speed.source.download: could not download the dataset") == 1
    assert "HF_TOKEN" in said and "Traceback" not in said


def test_a_requests_template_arguments_reach_the_template(tiny_models: Path,
                                                          tmp_path: Path) -> None:
    """`chat_template_kwargs` of a logged request (Qwen3's `enable_thinking: false`) are passed
    to the target's template as vLLM's server passes them; tools reach it too."""
    from specflow.spec.schema import TraceSource, WorkloadSpec
    from specflow.spec.traces import read_trace
    from specflow.workloads.model import Example
    from specflow.workloads.rendering import render
    from specflow.workloads.tokens import load_tokenizer

    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"type": "function", "function": {"name": "ls"}}],
                                "chat_template_kwargs": {"enable_thinking": False}}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    src = TraceSource(path=str(path))
    quiet, plain = read_trace(path, src).requests
    assert quiet.template_kwargs == (("enable_thinking", False),) and quiet.key != plain.key
    tok = load_tokenizer(str(tiny_models / "mimo_mtp2"))
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if tools %}[{{ tools | length }} tools]{% endif %}"
                         "{% if enable_thinking is defined and not enable_thinking %}"
                         "<think></think>{% endif %}")
    spec = WorkloadSpec(traffic_class="t", source=src)
    assert render("t", spec, (), Example("", request=quiet), tok) == "hi[1 tools]<think></think>"
    assert render("t", spec, (), Example("", request=plain), tok) == "hi"


def test_vllms_request_log_lines_become_a_trace(tmp_path: Path) -> None:
    """Lines as vLLM 0.32 writes them (the request logger's body line, a chat response's token
    ids under the endpoint's `chatcmpl-` id, a stream's `None`), in the shipped logging
    config's format and vLLM's default one; a body cut at --max-log-len is refused by line."""
    from specflow.spec.errors import SpecError
    from specflow.workloads import convert

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    lines = [
        f"DEBUG 2026-12-07T04:11:03 [request_logger.py:75] Request a1 JSON body: "
        f"{json.dumps(chat)}",
        "INFO 2026-12-07T04:11:03 [request_logger.py:66] Received request chatcmpl-a1: params: "
        "SamplingParams(n=1, max_tokens=9), lora_request: None.",
        "DEBUG 2026-12-07T04:11:04 [request_logger.py:100] Generated response chatcmpl-a1 "
        "details: output_token_ids: [5, 6, 7]",
        f"(APIServer pid=7) DEBUG 12-07 04:11:05 [request_logger.py:75] Request b2 JSON body: "
        f"{json.dumps({'model': 'm', 'prompt': 'def f(x):', 'max_tokens': 4})}",
        "DEBUG 2026-12-07T04:11:06 [request_logger.py:100] Generated response chatcmpl-b2 "
        "(streaming complete) details: output_token_ids: None",
    ]
    rows = list(convert.vllm_log(lines, "server.log", year=2026))
    assert rows == [
        {"request": chat, "request_id": "a1", "timestamp": "2026-12-07T04:11:03",
         "output_tokens": 3},
        {"request": {"model": "m", "prompt": "def f(x):", "max_tokens": 4}, "request_id": "b2",
         "timestamp": "2026-12-07T04:11:05"}]
    with pytest.raises(SpecError) as info:
        list(convert.vllm_log(['DEBUG x Request c3 JSON body: {"model": "m", "messages": [{"ro'],
                              "server.log"))
    assert "server.log:1: a request body that is not JSON" in info.value.render()
