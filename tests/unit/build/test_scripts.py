"""build_scripts/: one script per GPU profile, what its profile generates now, whose commands are
exactly those `specdec build --dry-run` prints, and which bash accepts."""

from __future__ import annotations

import subprocess

import pytest
from support.trtllm import GPU_PROFILES, profile_file

from specdec.build.scripts import SCRIPTS_DIR, build_script, script_path
from specdec.build.trtllm import EXAMPLES_ENV
from specdec.cli import main
from specdec.config import load_profile


@pytest.fixture(autouse=True)
def default_examples(monkeypatch):
    monkeypatch.delenv(EXAMPLES_ENV, raising=False)  # the image's examples/ folder, as the scripts name it


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_the_checked_in_script_is_what_the_profile_generates(name):
    path = profile_file(name)
    script = script_path(path)
    assert script.read_text() == build_script(load_profile(path), path), (
        f"{script} is stale: ./run build --profile {path.relative_to(path.parents[1])} --script > {script}"
    )
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_its_commands_are_the_dry_runs(name, capsys):
    path = profile_file(name)
    assert main(["build", "--profile", str(path), "--dry-run"]) == 0
    dry_run = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    script = [
        line for line in script_path(path).read_text().splitlines() if line and not line.startswith(("#", "set "))
    ]
    assert script[:-1] == dry_run  # then the repository rendered
    assert script[-1].endswith("--render-only")


def test_one_script_per_gpu_profile():
    assert sorted(p.name for p in SCRIPTS_DIR.glob("*.sh")) == sorted(
        script_path(profile_file(n)).name for n in GPU_PROFILES
    )
