"""Helpers for the deployment tests: the workspace's commands, Dockerfiles, .dockerignore, helm.

Docker is not available where the tests run, so Dockerfiles are read as text: `stages()` splits
one into its stages of (instruction, arguments), enough to check what each stage does.
`docker_context()` lists the files a `docker build .` would send, applying .dockerignore the
way Docker does (the last matching pattern wins; a pattern also matches everything below a
directory it names).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import ROOT

CHART = ROOT / "charts/flashcoupon"
CRD_NAME = "couponevents.flashcoupon.io.yaml"
CANONICAL_CRD = ROOT / "k8s/crd" / CRD_NAME
CHART_CRD = CHART / "crds" / CRD_NAME
KUBE_VERSION = "1.31.0"


def _toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def workspace_members() -> list[Path]:
    members = _toml(ROOT / "pyproject.toml")["tool"]["uv"]["workspace"]["members"]
    return [ROOT / m for m in members]


@dataclass(frozen=True)
class Script:
    package: str  # the distribution that declares it, e.g. flashcoupon-issuer
    target: str  # module:function


@cache
def console_scripts() -> dict[str, Script]:
    """Every [project.scripts] entry of the workspace's members."""
    found: dict[str, Script] = {}
    for member in workspace_members():
        project = _toml(member / "pyproject.toml")["project"]
        for name, target in project.get("scripts", {}).items():
            found[name] = Script(project["name"], target)
    return found


def module_package(module: str) -> str | None:
    """The member distribution whose src/ holds a runnable `module` (python -m), or None."""
    for member in workspace_members():
        base = member / "src" / Path(*module.split("."))
        if (base / "__main__.py").is_file() or base.with_suffix(".py").is_file():
            return _toml(member / "pyproject.toml")["project"]["name"]
    return None


def command_package(command: list[str]) -> str | None:
    """The distribution that provides what `command` runs, or None when nothing does."""
    if command[:2] in (["python", "-m"], ["python3", "-m"]) and len(command) > 2:
        return module_package(command[2])
    script = console_scripts().get(command[0])
    return script.package if script else None


# ---------------------------------------------------------------- Dockerfiles


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments), continuations joined

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def stages(dockerfile: Path) -> list[Stage]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction, rest = instruction.upper(), " ".join(rest.split())
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name, []))
        elif found:
            found[-1].instructions.append((instruction, rest))
    return found


def exec_form(arguments: str) -> list[str]:
    """CMD/ENTRYPOINT arguments: the JSON exec form, or the shell form split like a shell."""
    if arguments.startswith("["):
        return list(yaml.safe_load(arguments))
    return shlex.split(arguments)


def dockerfiles() -> list[Path]:
    # Not under .cache or .stack: image layers there (.cache/k8s/podman) hold copies of them.
    skip = {".venv", ".cache", ".stack"}
    return sorted(p for p in ROOT.glob("**/Dockerfile") if not skip & set(p.parts))


# ---------------------------------------------------------------- .dockerignore


def _pattern(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes?, pattern) in file order, from the repository's .dockerignore."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((not negated, _pattern(line.lstrip("!").strip("/"))))
    return rules


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for excludes, pattern in rules:
        if any(pattern.fullmatch(p) for p in prefixes):
            verdict = excludes
    return verdict


def docker_context() -> list[str]:
    """The files git tracks (and untracked, not ignored) that a `docker build .` sends."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    rules = dockerignore_rules()
    return [p for p in listed if (ROOT / p).is_file() and not ignored(p, rules)]


# ---------------------------------------------------------------- helm


def helm_binary() -> Path:
    """helm, built by scripts/tools.sh when it is missing (idempotent, fast when present)."""
    subprocess.run([ROOT / "scripts/tools.sh", "install"], check=True, capture_output=True)
    return Path(
        subprocess.run(
            [ROOT / "scripts/tools.sh", "path", "helm"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]
