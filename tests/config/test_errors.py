"""Invalid configurations: exit 2, one line per problem naming the field, never a traceback."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specflow import cli
from specflow.config.compose import conf_dir, load, load_plan
from specflow.config.validation import Sources
from specflow.spec.errors import Problem, Raw, SpecError
from tests.conftest import ROOT, run_cli

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
    (["sweep.budget.confirm_starts=5", "sweep.budget.max_confirm_starts=3"],
     "sweep.budget.max_confirm_starts"),
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
    (["hardware.memory_gib_per_device=inf"], "hardware.memory_gib_per_device"),
    (["hardware.memory_gib_per_device=1e308"], "hardware.memory_gib_per_device"),
    (["target.arch.num_params=nan"], "target.arch.num_params"),
    (["backend.request_timeout_s=inf"], "backend.request_timeout_s"),
    (["target.arch.layers=[]"], "target.arch.layers"),
    (["drafter=[none,eagle3]", "+drafter.eagl3.draft_tensor_parallel_size=2"], "drafter.eagl3"),
    (["drafter=[none,eagle3]", "drafter.ngram.prompt_lookup_min=2"],
     "drafter.ngram.prompt_lookup_min"),
    (["+drafter.foo=1"], "drafter.foo"),
    (["++drafter.foo=1"], "drafter.foo"),
    (["+sweep.repeats=3"], "sweep.repeats"),
    (["~sweep.nonexist"], "sweep.nonexist"),
]


@pytest.mark.parametrize(("overrides", "field"), INVALID,
                         ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_config_exits_2_naming_the_field(
        overrides: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["compile", "--no-vllm-check", *overrides])
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
        load(["experiment=cpu_tiny", "workload.chat.num_prompts=0"])
    (p,) = info.value.problems
    assert p.source == "override workload.chat.num_prompts=0"
    with pytest.raises(SpecError) as info:
        load_plan(["target=qwen3_8b", "drafter=mtp"])  # a cross-check: the drafter's file
    assert info.value.problems[0].source == "conf/drafter/mtp.yaml"
    sources = Sources(conf_dir(), {"experiment": "cpu_tiny", "sweep": "cpu_tiny"}, ())
    assert sources("workload.chat.num_prompts") == "conf/experiment/cpu_tiny.yaml"
    assert sources("workload.tool_calling.seed") == "conf/workload/tool_calling.yaml"
    assert sources("sweep.repeats") == "conf/sweep/cpu_tiny.yaml"
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


# ------------------------------------------------------------------ broken conf files


def _problem_lines(err: str) -> list[str]:
    """The problem lines of a rendered `SpecError`; asserts the header counts them all."""
    lines = err.splitlines()
    head = re.fullmatch(r"invalid configuration: (\d+) problems?", lines[0])
    assert head and int(head.group(1)) == len(lines) - 1, err
    assert all(ln.startswith("  - ") for ln in lines[1:]), err
    return lines[1:]


_GOOD_EXPERIMENT = """# @package _global_
defaults:
  - override /drafter: [none, ngram]
drafter:
  ngram:
    prompt_lookup_min: 2
    prompt_lookup_max: 4
"""

# (how the experiment is broken, line:column the problem must name)
BROKEN_YAML = {
    "tab": (_GOOD_EXPERIMENT.replace("    prompt_lookup_max", "\tprompt_lookup_max"), "7:1"),
    "bad indent": (_GOOD_EXPERIMENT.replace("    prompt_lookup_max", "   prompt_lookup_max"),
                   "7:4"),
    "unclosed bracket": (_GOOD_EXPERIMENT.replace("[none, ngram]", "[none, ngram"), "4:8"),
    "duplicate key": (_GOOD_EXPERIMENT + "    prompt_lookup_min: 3\n", "8:5"),
    "python tag": (_GOOD_EXPERIMENT + "evil: !!python/object/apply:os.system ['true']\n",
                   "8:7"),
    "not utf-8": (_GOOD_EXPERIMENT + "name: \udcff\n", "8:7"),
}


@pytest.fixture
def own_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/ in a temp dir, selected with SPECFLOW_CONF."""
    root = tmp_path / "conf"
    shutil.copytree(conf_dir(), root)
    monkeypatch.setenv("SPECFLOW_CONF", str(root))
    return root


@pytest.mark.parametrize("how", list(BROKEN_YAML))
def test_broken_yaml_is_one_problem_naming_file_line_and_column(
        how: str, own_conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, where = BROKEN_YAML[how]
    (own_conf / "experiment" / "x.yaml").write_text(text, errors="surrogateescape")
    rc = cli.main(["compile", "--no-vllm-check", "experiment=x", "sweep.repeats=3"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", err
    (line,) = _problem_lines(err)
    assert line.startswith(f"  - conf/experiment/x.yaml:{where}: "), line
    assert line.endswith("[conf/experiment/x.yaml]"), line


def test_duplicate_key_in_a_group_file_is_refused(own_conf: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = own_conf / "sweep" / "default.yaml"
    n = len(path.read_text().splitlines())
    path.write_text(path.read_text() + "repeats: 7\n")  # PyYAML alone would keep the last
    assert cli.main(["compile", "--no-vllm-check"]) == 2
    (line,) = _problem_lines(capsys.readouterr().err)
    assert line.startswith(f"  - conf/sweep/default.yaml:{n + 1}:1: invalid YAML: found "
                           "duplicate key repeats"), line


def test_broken_yaml_in_a_real_process(own_conf: Path) -> None:
    (own_conf / "experiment" / "x.yaml").write_text(BROKEN_YAML["tab"][0])
    proc = run_cli("compile", "--no-vllm-check", "experiment=x")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    (line,) = _problem_lines(proc.stderr)
    assert line.startswith("  - conf/experiment/x.yaml:7:1: invalid YAML: found character "
                           "'\\t' that cannot start any token; got '\\tprompt_lookup_max: 4'")


# ------------------------------------------------------------------ numbers, layers, entries


@pytest.mark.parametrize("override", [
    "hardware.memory_gib_per_device=inf", "hardware.memory_gib_per_device=1e308",
    "target.arch.num_params=inf", "target.arch.num_params=nan", "target.arch.num_params=1e308",
    "target.arch.active_params=nan",
    "drafter.draft_model.checkpoints.qwen3_8b.arch.num_params=inf",
    "backend.request_timeout_s=inf", "backend.startup_timeout_s=1e308",
    "promote.slo.p99_tpot_ms=inf", "hardware.bf16_tflops=-inf",
    "+drafter.draft_model.extra_speculative_config.x=nan",
    "target.max_model_len=" + "9" * 330, "target.arch.hidden_size=" + "9" * 330,
    "backend.engine.max_num_seqs=" + "9" * 330,
])
def test_non_finite_or_absurd_numbers_are_problems_naming_the_field(override: str) -> None:
    key = override.split("=", 1)[0].lstrip("+")
    if key == "target.arch.active_params":
        override = "+" + override
    with pytest.raises(SpecError) as info:
        load_plan(["drafter=[none,draft_model]", override])
    (p,) = info.value.problems
    assert p.path == key and p.source == f"override {override}"
    assert p.problem in ("not a finite number", "out of range"), p.render()


def test_headroom_of_an_infinite_memory_is_exit_2_not_an_overflow() -> None:
    proc = run_cli("headroom", "hardware.memory_gib_per_device=inf")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = _problem_lines(proc.stderr)
    assert line.startswith("  - hardware.memory_gib_per_device: not a finite number; got Infinity")


def test_a_target_needs_a_layer_group_of_any_kind() -> None:
    with pytest.raises(SpecError) as info:
        load(["target.arch.layers=[]"])
    (p,) = info.value.problems
    assert p.path == "target.arch.layers" and "at least one layer group" in p.problem
    assert p.source == "override target.arch.layers=[]"
    linear = ("target.arch.layers=[{kind: linear_attention, count: 2, num_key_heads: 2, "
              "num_value_heads: 2, key_head_dim: 64, value_head_dim: 64}]")
    assert load([linear]).spec.target.arch.layers[0].kind == "linear_attention"
    # a drafter checkpoint may still keep no KV of its own
    assert load(["drafter=[none,gemma4_mtp]", "target=gemma4_31b"]).spec


@pytest.mark.parametrize(("overrides", "path", "says"), [
    (["drafter=[none,eagle3]", "+drafter.eagl3.draft_tensor_parallel_size=2"], "drafter.eagl3",
     "did you mean 'eagle3'?"),
    (["drafter=[none,eagle3]", "drafter.eagl3.draft_tensor_parallel_size=2"], "drafter.eagl3",
     "did you mean 'eagle3'?"),
    (["drafter=[none,eagle3]", "drafter.ngram.prompt_lookup_min=2"],
     "drafter.ngram.prompt_lookup_min", "to select it: drafter=[none,eagle3,ngram]"),
    (["drafter=[none,eagle3]", "+drafter.ngram.draft_tensor_parallel_size=1"],
     "drafter.ngram.draft_tensor_parallel_size", "is not selected"),
    (["experiment=cpu_tiny", "drafter=[none,draft_model]", "drafter.ngram.prompt_lookup_min=2"],
     "drafter.ngram.prompt_lookup_min", "to select it: drafter=[none,draft_model,ngram]"),
    (["workload=[chat]", "workload.gsm8k.num_prompts=3"], "workload.gsm8k.num_prompts",
     "to select it: workload=[chat,gsm8k]"),
    (["+workload.chatt.seed=1"], "workload.chatt", "did you mean 'chat'?"),
])
def test_override_of_an_unselected_or_misspelt_entry_is_refused(
        overrides: list[str], path: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        load(overrides)
    (p,) = info.value.problems
    assert p.path == path and says in p.render(), p.render()
    assert p.source == f"override {overrides[-1]}"


def test_an_experiment_may_still_tune_entries_it_does_not_select() -> None:
    # cpu_tiny tunes ngram; selecting other drafters on the command line drops that silently
    loaded, _ = load_plan(["experiment=cpu_tiny", "drafter=[none,draft_model]"])
    assert set(loaded.spec.drafter) == {"none", "draft_model"}


@pytest.mark.parametrize(("override", "path"), [
    ("+drafter.foo=1", "drafter.foo"), ("++drafter.foo=1", "drafter.foo"),
    ("+workload.foo=1", "workload.foo"), ("++target.foo=1", "target.foo"),
    ("++drafter.ngram.foo=1", "drafter.ngram.foo"), ("+experiment.foo=1", "experiment"),
    ("++hydra.foo=1", "hydra"), ("++foo=1", "foo"),
])
def test_unknown_keys_are_refused_added_or_force_added(override: str, path: str) -> None:
    with pytest.raises(SpecError) as info:
        load([override])
    (p,) = info.value.problems
    assert p.path == path and p.source == f"override {override}", p.render()


# ------------------------------------------------------------------ Hydra's refusals


@pytest.mark.parametrize(("overrides", "paths", "says"), [
    (["+sweep.repeats=3", "sweep.warmup_requests=-1"], ["sweep.repeats", "sweep.warmup_requests"],
     "'++sweep.repeats=...' to set it either way"),
    (["sweep.repeats=0", "~sweep.nonexist"], ["sweep.nonexist", "sweep.repeats"],
     "unknown key"),
    (["sweep.repeats=0", "~sweep.repets"], ["sweep.repets", "sweep.repeats"],
     "did you mean 'repeats'?"),
    (["sweep.repeats=0", "~sweep.repeats=7"], ["sweep.repeats", "sweep.repeats"],
     "its value is 0, not 7"),
    (["~target.revision", "sweep.repeats=0"], ["target.revision", "sweep.repeats"],
     "nothing to delete"),
    (["target.arch.active_params=1e9", "sweep.repeats=0"],
     ["target.arch.active_params", "sweep.repeats"], "'+target.arch.active_params=...'"),
    (["sweep.concurrency.x=1", "sweep.repeats=0"], ["sweep.concurrency.x", "sweep.repeats"],
     "cannot apply"),
])
def test_a_refused_override_is_named_and_the_rest_still_checked(
        overrides: list[str], paths: list[str], says: str) -> None:
    with pytest.raises(SpecError) as info:
        load(overrides)
    problems = info.value.problems
    assert [p.path for p in problems] == paths, info.value.render()
    refused = next(p for p in problems if p.source != "override sweep.repeats=0"
                   and p.source != "override sweep.warmup_requests=-1")
    assert refused.source.startswith("override ") and refused.source[9:] in overrides
    assert says in refused.render() and "\n" not in refused.render()


def test_a_refused_override_in_a_real_process() -> None:
    proc = run_cli("compile", "--no-vllm-check", "sweep.repeats=0", "+sweep.repeats=3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = _problem_lines(proc.stderr)
    assert lines[0].startswith("  - sweep.repeats: already set, so '+' cannot add it; got 3")
    assert lines[0].endswith("[override +sweep.repeats=3]")
    assert lines[1].startswith("  - sweep.repeats: out of range; got 0")


# ------------------------------------------------------------------ multirun (-m)


def test_sweep_syntax_expands_to_every_combination() -> None:
    combos = cli.combinations(["experiment=cpu_tiny", "drafter=[none,ngram]",
                               "target=tiny,qwen3_8b", "sweep.repeats=range(1,3)"])
    assert [swept for _, swept in combos] == [
        ["target=tiny", "sweep.repeats=1"], ["target=tiny", "sweep.repeats=2"],
        ["target=qwen3_8b", "sweep.repeats=1"], ["target=qwen3_8b", "sweep.repeats=2"]]
    assert all(c[:2] == ["experiment=cpu_tiny", "drafter=[none,ngram]"] for c, _ in combos)
    assert cli.combinations(["+x=1", "~y"]) == [(["+x=1", "~y"], [])]


def test_multirun_runs_the_valid_combinations_and_reports_each_invalid_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["-m", "compile", "--no-vllm-check", "experiment=cpu_tiny",
                     "workload.chat.max_tokens=8,-1", "sweep.repeats=1,0"])
    out, errs = capsys.readouterr()
    assert code == 2
    assert "multirun: 4 combinations of compile, 3 invalid" in errs
    assert '"num_windows"' in out and out.count('"plan_hash"') == 1  # the valid one compiled
    assert re.findall(r"invalid configuration: (\d) problems?", errs) == ["1", "1", "2"]
    lines = [x for x in errs.splitlines() if x.startswith("  - ")]
    assert len(lines) == 4  # one line per problem of each invalid combination
    assert sum("workload.chat.max_tokens: out of range; got -1" in x for x in lines) == 2
    assert sum("sweep.repeats: out of range; got 0" in x for x in lines) == 2
    assert "#0 workload.chat.max_tokens=8 sweep.repeats=1: exit 0 (ok)" in errs
    assert "#3 workload.chat.max_tokens=-1 sweep.repeats=0: exit 2 (invalid, not run)" in errs


def test_the_command_line_says_every_problem_of_its_words_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """argparse parses the command line; its problems are said as a config's are: all at once,
    one line each, exit 2, no usage dump and no traceback."""
    assert cli.main(["compil", "--bogus", "--cfg=x", "target=qwen3_8b"]) == 2
    lines = _problem_lines(capsys.readouterr().err)
    assert [x.split(";")[0] for x in lines] == [
        "  - argv: unknown option", "  - command: unknown command",
        "  - --cfg: unknown config view"], lines
    assert "got '--bogus'" in lines[0] and "did you mean 'compile'?" in lines[1]
    assert cli.main(["compile", "target=qwen3_8b", "--cfg"]) == 2
    err = capsys.readouterr().err
    assert _problem_lines(err) == [
        "  - --cfg: needs a value; got null; expected one of ['job', 'all']"]
    assert "Traceback" not in err and "usage:" not in err
    assert cli.main(["--help"]) == 0 and "compare A B" in capsys.readouterr().out


@pytest.mark.parametrize(("override", "says"), [
    ("workload=glob(*)", "glob() is not supported"),
    ("target=[a", "cannot be swept"),
])
def test_multirun_names_an_override_it_cannot_sweep(override: str, says: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-m", "compile", "--no-vllm-check", override]) == 2
    (line,) = _problem_lines(capsys.readouterr().err)
    assert line.startswith("  - override: ") and says in line and repr(override) in line


def test_several_values_without_multirun_point_to_it() -> None:
    with pytest.raises(SpecError) as info:
        load(["experiment=cpu_tiny", "workload.chat.max_tokens=8,9"])
    (problem,) = info.value.problems
    assert problem.path == "workload.chat.max_tokens"
    assert "several values for one run" in problem.render() and "--multirun" in problem.render()


# ------------------------------------------------------------------ one line per problem


def test_control_characters_never_split_a_problem(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", "--no-vllm-check", "sweep.repeats='a\nb'", "sweep.warmup_requests="
                     "':smile: [red]x\x1b[2J\u2028'"]) == 2
    lines = _problem_lines(capsys.readouterr().err)
    assert len(lines) == 2
    assert lines[0] == ("  - sweep.repeats: wrong type; got 'a\\nb'; expected an integer "
                        "[override sweep.repeats='a\\nb']")
    assert ":smile: [red]x\\x1b[2J\\u2028" in lines[1]  # no emoji, markup or escape applied
    rendered = Problem("a\tb", "c\rd", Raw("e\nf"), "g\x00", "h\x85", "i\u2029").render()
    assert rendered.isprintable(), rendered


# ------------------------------------------------------------------ the deployment entry point


def test_deploy_refuses_an_invalid_config_the_way_the_cli_does() -> None:
    proc = subprocess.run([sys.executable, "-m", "pipelines.deploy", "sweep.repeats=0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    cli_proc = run_cli("compile", "--no-vllm-check", "sweep.repeats=0")
    assert proc.returncode == cli_proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr == cli_proc.stderr
    assert _problem_lines(proc.stderr)[0].startswith("  - sweep.repeats: out of range; got 0")


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


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(overrides=st.lists(_OVERRIDE, max_size=4))
def test_random_overrides_never_raise(overrides: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["compile", "--no-vllm-check", *overrides])
    out, err = capsys.readouterr()
    assert rc in (0, 2)
    if rc == 2:
        assert err.startswith("invalid configuration:") and out == ""


def test_no_secret_typed_on_the_command_line_is_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever problem an override causes, the value of a secret option in it is never shown."""
    for override in ("drafter.ngram.extra_args=[--api-key,SECRETX]",
                     "backend.engine.extra_args=[--api-key=SECRETX]",
                     "+backend.engine.extra_args=[--hf-token,SECRETX]"):
        assert cli.main(["compile", "--no-vllm-check", "drafter=[none,ngram]", override]) == 2
        out, err = capsys.readouterr()
        assert "SECRETX" not in out + err and "***" in err, err
