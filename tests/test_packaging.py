"""A non-editable install ships what the commands need: conf/, prompt data, prefect.yaml."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from specflow.config.compose import load_plan
from specflow.spec.serialize import as_json

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the built wheel of this checkout; its dependencies are borrowed
    from the test environment through a .pth (so the editable install cannot shadow it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp / "dist")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("specflow-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([py, "-c", code], check=True, capture_output=True,
                             text=True).stdout.strip()
    (Path(purelib) / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "-q", str(wheel)], check=True, capture_output=True, timeout=300)
    return env_dir / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPECFLOW_CONF"}
    return subprocess.run([bin_dir / "specflow", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_wheel_runs_compile_and_headroom_from_anywhere(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run([installed / "python", "-c", "import specflow, specflow.workloads; "
                            "print(specflow.__file__)"], cwd=tmp_path, capture_output=True,
                           text=True, check=True).stdout
    assert str(ROOT) not in where, "the editable checkout was imported, not the wheel"
    proc = _run(installed, "compile", "target=qwen3_8b", "drafter=eagle3", "--no-vllm-check",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the same plan as the checkout compiles (conf/ shipped whole and unchanged)
    assert json.loads(proc.stdout) == as_json(load_plan(["target=qwen3_8b", "drafter=eagle3"])[1])
    proc = _run(installed, "headroom", "target=qwen3_8b", "hardware=h200", "drafter=eagle3",
                "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {h["fit"] for h in json.loads(proc.stdout)} == {"fits"}
    # the prompt data ships too: an offline workload materialises from the installed package
    code = ("from pathlib import Path; from specflow.config.compose import load; "
            "from specflow.workloads import materialize_all; "
            "s = load(['workload=[chat,tool_calling]', 'workload.chat.chat_template=false', "
            "'workload.tool_calling.chat_template=false']).spec; "
            "done = materialize_all(s.workload, Path('ds')); "
            "print(sorted(m.num_prompts for m in done.values()))")
    out = subprocess.run([installed / "python", "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [32, 32]


def test_specflow_conf_still_overrides(installed: Path, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    subprocess.run(["cp", "-r", str(ROOT / "conf"), str(conf)], check=True)
    (conf / "target" / "qwen3_8b.yaml").write_text(
        (conf / "target" / "qwen3_8b.yaml").read_text().replace("model: Qwen/Qwen3-8B",
                                                                "model: mine/Qwen3-8B-tuned"))
    env = dict(os.environ, SPECFLOW_CONF=str(conf))
    proc = subprocess.run([installed / "specflow", "compile", "target=qwen3_8b", "--no-vllm-check"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    engine_configs = json.loads(proc.stdout)["engine_configs"]
    assert {ec["serve_argv"][2] for ec in engine_configs} == {"mine/Qwen3-8B-tuned"}
