"""Invalid configurations: exit 2, one line per problem naming the field, never a traceback."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specflow import cli
from specflow.config.compose import Sources, conf_dir, load, load_plan
from specflow.core.errors import SpecError
from tests.conftest import run_cli

# (overrides, dotted field the message must name)
INVALID: list[tuple[list[str], str]] = [
    (["sweep.repeats=abc"], "sweep.repeats"),
    (["sweep.repeats=0"], "sweep.repeats"),
    (["sweep.repets=3"], "sweep.repets"),
    (["sweep.concurrency=[0]"], "sweep.concurrency[0]"),
    (["sweep.concurrency=[-4,8]"], "sweep.concurrency[0]"),
    (["sweep.concurrency=[]"], "sweep.concurrency"),
    (["+sweep.num_speculative_tokens.ngram=[-1]"], "sweep.num_speculative_tokens.ngram[0]"),
    (["+sweep.num_speculative_tokens.ngram=[0]"], "sweep.num_speculative_tokens.ngram[0]"),
    (["+sweep.num_speculative_tokens.nram=[2]"], "sweep.num_speculative_tokens.nram"),
    (["sweep.max_engine_configs=1"], "sweep.max_engine_configs"),
    (["+target.foo=1"], "target.foo"),
    (["target=qwen3_8"], "target"),
    (["target.dtype=bf16"], "target.dtype"),
    (["target.tensor_parallel_size=0"], "target.tensor_parallel_size"),
    (["target.tensor_parallel_size=4"], "target.tensor_parallel_size"),
    (["target.max_model_len=8"], "target.max_model_len"),
    (["target.arch.layers=[{kind: ful, count: 2}]"], "target.arch.layers[0].kind"),
    (["drafter=[none,eagl3]"], "drafter"),
    (["drafter=[]"], "drafter"),
    (["target=qwen3_8b", "drafter=gemma4_mtp"], "drafter.gemma4_mtp"),
    (["target=qwen3_8b", "drafter=mtp"], "drafter.mtp"),
    (["target=qwen3_5_27b", "drafter=mtp", "target.arch.mtp_depth=2",
      "+sweep.num_speculative_tokens.mtp=[3]"], "sweep.num_speculative_tokens.mtp[0]"),
    (["drafter.ngram.prompt_lookup_min=6"], "drafter.ngram.prompt_lookup_min"),
    (["drafter.ngram.method=ngrm"], "drafter.ngram.method"),
    (["drafter.ngram.vendors=[nvidia,amdd]"], "drafter.ngram.vendors[1]"),
    (["drafter=eagle3", "drafter.eagle3.draft_tensor_parallel_size=3",
      "target.tensor_parallel_size=2", "hardware.device_count=2"],
     "drafter.eagle3.draft_tensor_parallel_size"),
    (["drafter=draft_model", "drafter.draft_model.checkpoints.qwen3_8b.arch.vocab_size=1000"],
     "drafter.draft_model.checkpoints.qwen3_8b.arch.vocab_size"),
    (["drafter=eagle3", "+drafter.eagle3.num_speculative_tokens_per_batch_size=[[2,4,3]]"],
     "drafter.eagle3.num_speculative_tokens_per_batch_size"),
    (["drafter=eagle3", "+drafter.eagle3.num_speculative_tokens_per_batch_size=[[1,8,3],[4,16,2]]"],
     "drafter.eagle3.num_speculative_tokens_per_batch_size[1]"),
    (["drafter=dspark", "hardware=cpu"], "drafter.dspark"),
    (["drafter=[none,suffix]", "hardware=mi300x"], "drafter.suffix"),
    (["drafter.eagle3.method=eagle3"], "drafter.eagle3.method"),
    (["hardware.memory_gib_per_device=-1"], "hardware.memory_gib_per_device"),
    (["hardware=tpu_v5"], "hardware"),
    (["workload.chat.temperature=5"], "workload.chat.temperature"),
    (["workload.chat.source.kind=http"], "workload.chat.source.kind"),
    (["backend.port=70000"], "backend.port"),
    (["backend=endpoint"], "backend.served_model_name"),
    (["backend=endpoint", "backend.served_model_name=m", "backend.url=ftp://x"], "backend.url"),
    (["promote.confidence=1.5"], "promote.confidence"),
    (["experiment=nope"], "experiment"),
    (["tracking.uri=${nope.missing}"], "tracking.uri"),
]


@pytest.mark.parametrize(("overrides", "field"), INVALID,
                         ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_config_exits_2_naming_the_field(
        overrides: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["compile", "--no-probe", *overrides])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert out == ""
    lines = [ln for ln in err.splitlines() if ln.startswith("  - ")]
    assert lines, err
    assert any(ln.startswith(f"  - {field}: ") for ln in lines), err
    line = next(ln for ln in lines if ln.startswith(f"  - {field}: "))
    assert "; got " in line and "; expected " in line, line
    assert "[" in line and line.rstrip().endswith("]"), f"no source file/override in: {line}"


def test_there_are_at_least_25_distinct_invalid_configs() -> None:
    assert len({tuple(o) for o, _ in INVALID}) >= 25


def test_every_problem_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        load(["target=qwen3_8", "drafter=[none,eagl3]", "sweep.repets=3",
              "hardware.memory_gib_per_device=-1", "+target.foo=1", "sweep.concurrency=[0]"])
    paths = [p.path for p in info.value.problems]
    assert paths == ["target", "drafter", "sweep.repets", "target.foo",
                     "hardware.memory_gib_per_device", "sweep.concurrency[0]"]
    rendered = info.value.render()
    assert "did you mean 'qwen3_8b'?" in rendered and "did you mean 'eagle3'?" in rendered
    assert "did you mean 'repeats'?" in rendered


def test_source_file_is_named() -> None:
    with pytest.raises(SpecError) as info:
        load(["experiment=cpu_demo", "workload.chat.num_prompts=0"])
    (p,) = info.value.problems
    assert p.source == "override workload.chat.num_prompts=0"
    with pytest.raises(SpecError) as info:
        load_plan(["target=qwen3_8b", "drafter=mtp"])  # a cross-check: the drafter's file
    assert info.value.problems[0].source == "conf/drafter/mtp.yaml"
    sources = Sources(conf_dir(), {"experiment": "cpu_demo", "sweep": "cpu_demo"}, ())
    assert sources("workload.chat.num_prompts") == "conf/experiment/cpu_demo.yaml"
    assert sources("workload.tool_calling.seed") == "conf/workload/tool_calling.yaml"
    assert sources("sweep.repeats") == "conf/sweep/cpu_demo.yaml"
    assert sources("tracking.uri") == "conf/config.yaml"


def test_real_process_exit_code_and_no_traceback() -> None:
    proc = run_cli("compile", "sweep.repeats=-1", "drafter=[none,eagl3]")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "sweep.repeats: out of range; got -1" in proc.stderr
    proc = run_cli("compil")
    assert proc.returncode == 2 and "did you mean 'compile'?" in proc.stderr
    proc = run_cli("--cfg", "jobs")
    assert proc.returncode == 2 and "--cfg" in proc.stderr


# ------------------------------------------------------------------ property: never a traceback

_KEYS = ["sweep.repeats", "sweep.concurrency", "sweep.warmup_requests", "target.max_model_len",
         "target.tensor_parallel_size", "target.dtype", "target.arch.hidden_size",
         "hardware.device_count", "hardware.memory_gib_per_device", "backend.port",
         "backend.engine.gpu_memory_utilization", "promote.margin",
         "drafter.ngram.prompt_lookup_min",
         "drafter.ngram.prompt_lookup_max", "drafter.ngram.method", "workload.chat.num_prompts",
         "workload.chat.source.kind", "tracking.uri", "sweep.nope", "target.arch.layers",
         "nope", "target"]
_VALUES = st.one_of(
    st.integers(-5, 70000).map(str),
    st.sampled_from(["abc", "[]", "[1,2]", "[0]", "{}", "null", "true", "1.5", "-0.5", "'x y'",
                     "${nope}", "[a,b]", "{kind: ful}", "???", "bfloat16", "ngram"]),
)
_GROUP = st.sampled_from(["target", "drafter", "hardware", "workload", "sweep", "promote",
                          "backend", "experiment", "drafters"])
_OPTION = st.sampled_from(["qwen3_8b", "tiny", "eagle3", "[none,mtp]", "[none,eagle3]", "cpu",
                           "h200", "chat", "[chat,gsm8k]", "cpu_demo", "endpoint", "nope",
                           "dspark", "[]", "null"])
_OVERRIDE = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(_KEYS), _VALUES),
    st.builds(lambda k, v: f"+{k}={v}", st.sampled_from(_KEYS), _VALUES),
    st.builds(lambda g, o: f"{g}={o}", _GROUP, _OPTION),
    st.text(alphabet="ab=.[]{}+~$ ", min_size=1, max_size=8),
)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(overrides=st.lists(_OVERRIDE, max_size=4))
def test_random_overrides_never_raise(overrides: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["compile", "--no-probe", *overrides])
    out, err = capsys.readouterr()
    assert rc in (0, 2)
    if rc == 2:
        assert err.startswith("invalid configuration:") and out == ""
