"""Each Dockerfile's build stage, replayed without Docker (none runs here).

The build context is what `docker build .` would send (.dockerignore applied); the stage's
COPY instructions copy from it into a scratch /src, and its `uv sync` commands run there in
order, with the venv in a scratch directory and this machine's Python instead of the image's.
Then every workspace console script the venv holds must import: that proves the COPY set is
enough for `uv sync --frozen`, the package's declared dependencies are enough for its code, and
the wheels carry their data files (Lua scripts, migrations), with no editable link back to /src.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.deploy import (
    ROOT,
    command_package,
    console_scripts,
    docker_context,
    dockerfiles,
    exec_form,
    stages,
)

DOCKERFILES = [pytest.param(p, id=str(p.relative_to(ROOT))) for p in dockerfiles()]


def uv_command() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def replay_build(dockerfile: Path, context: list[str], src: Path, venv: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(
        UV_PROJECT_ENVIRONMENT=str(venv),
        UV_PYTHON=sys.executable,
        UV_LINK_MODE="copy",
        UV_PYTHON_DOWNLOADS="never",
    )
    for instruction, args in stages(dockerfile)[0].instructions:
        if instruction == "COPY":
            *sources, dest = args.split()
            for source in (s.rstrip("/") for s in sources):
                for path in context:
                    if path == source:  # a file: into dest/ (a directory) or as dest
                        into_dir = dest.endswith("/") or len(sources) > 1
                        out = src / dest / Path(path).name if into_dir else src / dest
                    elif path.startswith(source + "/"):  # a directory: its contents
                        out = src / dest / Path(path).relative_to(source)
                    else:
                        continue
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(ROOT / path, out)
        elif instruction == "RUN" and args.startswith("uv sync"):
            command = uv_command() + shlex.split(args)[1:]
            done = subprocess.run(command, cwd=src, env=env, capture_output=True, text=True)
            assert done.returncode == 0, f"{args}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_stage_installs_a_venv_that_runs_the_image_command(
    dockerfile: Path, tmp_path: Path
) -> None:
    src, venv = tmp_path / "src", tmp_path / "venv"
    replay_build(dockerfile, docker_context(), src, venv)
    (cmd,) = stages(dockerfile)[-1].args("CMD")
    command = exec_form(cmd)
    assert command_package(command) is not None
    python = venv / "bin/python"
    modules = []
    for name, script in console_scripts().items():
        if (venv / "bin" / name).exists():
            modules.append(script.target.partition(":")[0])
    if command[0] == "python":
        modules.append(command[2])
    else:
        assert (venv / "bin" / command[0]).exists(), f"{command[0]} not installed"
    probe = (
        "import importlib, pathlib, sys\n"
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "import flashcoupon_common.lua as lua, flashcoupon_common.db as db\n"
        "here = pathlib.Path(lua.__file__).parent\n"
        "assert list(here.glob('*.lua')), 'Lua scripts missing from the wheel'\n"
        "assert list((pathlib.Path(db.__file__).parent / 'migrations/versions').glob('*.py'))\n"
        "assert str(here).startswith(sys.prefix), f'editable install: {here}'\n"
    )
    done = subprocess.run(
        [str(python), "-c", probe, *modules], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dev_only = [p for p in ("pytest", "ruff") if (venv / "bin" / p).exists()]
    assert not dev_only, f"dev tools in the image: {dev_only}"
