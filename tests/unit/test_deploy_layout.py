"""The deployment layout, read as files: skaffold.yaml, the Dockerfiles, .dockerignore, the
chart's values and schema, and the two copies of the CRD. No servers, no helm, no Docker.

What each test protects: skaffold builds exactly the images the chart runs; every image is
built from the lock for the package whose command it runs, and runs unprivileged with nothing
but that package's venv; the build context holds what the Dockerfiles copy; the chart's values
satisfy its schema and the schema refuses typos; the chart ships the canonical CRD.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.deploy import (
    CANONICAL_CRD,
    CHART,
    CHART_CRD,
    ROOT,
    Stage,
    command_package,
    docker_context,
    dockerfiles,
    exec_form,
    stages,
    workspace_members,
)

SKAFFOLD = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
ARTIFACTS = SKAFFOLD["build"]["artifacts"]
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
IMAGE_SETTINGS = {"registry", "tag", "pullPolicy", "pullSecrets"}
DOCKERFILES = [pytest.param(p, id=str(p.relative_to(ROOT))) for p in dockerfiles()]


def sanitized(image: str) -> str:
    """How skaffold names an artifact in its template variables: IMAGE_..._<sanitized>."""
    return re.sub(r"[^A-Za-z0-9]", "_", image)


def chart_images() -> dict[str, dict[str, str]]:
    return {k: v for k, v in VALUES["images"].items() if k not in IMAGE_SETTINGS}


def final_stage(dockerfile: Path) -> Stage:
    return stages(dockerfile)[-1]


def build_stages(dockerfile: Path) -> list[Stage]:
    return stages(dockerfile)[:-1]


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def schema_errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)
    ]


def project_name(member: Path) -> str:
    return str(tomllib.loads((member / "pyproject.toml").read_text())["project"]["name"])


def installed_by(package: str) -> set[str]:
    """The workspace distributions an image built for `package` holds: it and its members."""
    members = {project_name(m): m for m in workspace_members()}
    project = tomllib.loads((members[package] / "pyproject.toml").read_text())["project"]
    deps = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0] for d in project["dependencies"]}
    return {package} | set().union(*(installed_by(d) for d in deps if d in members))


# ---------------------------------------------------------------- skaffold


def test_skaffold_config_version_and_artifacts() -> None:
    assert SKAFFOLD["apiVersion"].startswith("skaffold/v4beta")
    assert len(ARTIFACTS) == 4
    for artifact in ARTIFACTS:
        assert artifact["context"] == ".", "the Dockerfiles expect the repository root as context"
        dockerfile = ROOT / artifact["docker"]["dockerfile"]
        assert dockerfile.is_file(), f"{artifact['image']}: {dockerfile} does not exist"


def test_skaffold_builds_every_image_the_chart_runs_and_wires_it_in() -> None:
    built = {a["image"] for a in ARTIFACTS}
    assert {v["repository"] for v in chart_images().values()} == built
    templates = SKAFFOLD["deploy"]["helm"]["releases"][0]["setValueTemplates"]
    expected = {
        f"images.{key}.ref": "{{.IMAGE_FULLY_QUALIFIED_" + sanitized(image["repository"]) + "}}"
        for key, image in chart_images().items()
    }
    assert templates == expected
    release = SKAFFOLD["deploy"]["helm"]["releases"][0]
    assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()


# ---------------------------------------------------------------- Dockerfiles


def test_every_service_folder_has_a_dockerfile() -> None:
    members = {m for m in workspace_members() if m.name not in ("common", "loadtest")}
    assert {p.parent for p in dockerfiles()} == members


def test_dockerfiles_agree_on_base_image_uv_and_user() -> None:
    # Docker has no include: the four Dockerfiles repeat one skeleton, so keep it in step.
    def skeleton(dockerfile: Path) -> tuple[list[str], list[str], list[str]]:
        args = [line for line in dockerfile.read_text().splitlines() if line.startswith("ARG ")]
        runtime = final_stage(dockerfile)
        return args, runtime.args("USER"), runtime.args("RUN")

    skeletons = {str(p.relative_to(ROOT)): skeleton(p) for p in dockerfiles()}
    assert len({repr(s) for s in skeletons.values()}) == 1, skeletons


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    users = final_stage(dockerfile).args("USER")
    assert users, "the final stage sets no USER: the container would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]}: use a numeric, non-zero uid"
    assert not gid or (gid.isdigit() and int(gid) > 0)
    assert int(uid) == VALUES["pod"]["uid"], "the chart's runAsUser must match the image"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_final_stage_holds_only_the_venv_and_no_build_tools(dockerfile: Path) -> None:
    last = final_stage(dockerfile)
    assert last.base == stages(dockerfile)[0].base, "build and runtime share one slim base"
    assert "slim" in re.sub(r"\$\{?PYTHON_IMAGE\}?", "python:3.12-slim", last.base)
    for run in last.args("RUN"):
        assert not re.search(r"\b(pip|uv|apt-get|apk|gcc|make)\b", run), run
    copies = last.args("COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies), copies
    assert all(c.split()[1] == "/app/.venv" for c in copies)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_installs_the_locked_package_whose_command_the_image_runs(dockerfile: Path) -> None:
    (cmd,) = final_stage(dockerfile).args("CMD")
    package = command_package(exec_form(cmd))
    assert package is not None, f"CMD {cmd} is neither a workspace console script nor a module"
    syncs = [r for s in build_stages(dockerfile) for r in s.args("RUN") if "uv sync" in r]
    assert len(syncs) == 2, "dependencies first (cached layer), then the workspace packages"
    for sync in syncs:
        words = sync.split()
        assert "--frozen" in words and "--no-dev" in words, sync
        assert words[words.index("--package") + 1] == package, sync
    assert "--no-editable" in syncs[-1].split(), "the venv must not point back at /src"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_build_copies_the_lock_and_every_member_the_package_needs(dockerfile: Path) -> None:
    (cmd,) = final_stage(dockerfile).args("CMD")
    package = str(command_package(exec_form(cmd)))
    copies = [a.split() for s in build_stages(dockerfile) for a in s.args("COPY")]
    copied = {source.rstrip("/") for args in copies for source in args[:-1]}
    members = {project_name(m): str(m.relative_to(ROOT)) for m in workspace_members()}
    needed = {"pyproject.toml", "uv.lock"} | {members[p] for p in installed_by(package)}
    assert needed <= copied, f"uv sync needs {sorted(needed - copied)}"
    extra = {members[p] for p in members if p not in installed_by(package)} & copied
    assert not extra, f"copied but not installed (rebuilds for nothing): {sorted(extra)}"


def test_docker_context_holds_what_the_dockerfiles_copy_and_little_else() -> None:
    context = docker_context()
    for dockerfile in dockerfiles():
        for copy_args in (a for s in build_stages(dockerfile) for a in s.args("COPY")):
            for source in copy_args.split()[:-1]:
                source = source.rstrip("/")
                assert any(p == source or p.startswith(source + "/") for p in context), (
                    f"{dockerfile.relative_to(ROOT)} copies {source}, which .dockerignore excludes"
                )
    leaked = [p for p in context if p.startswith(("tests/", "docs/", ".venv/", ".cache/", "k8s/"))]
    assert not leaked
    assert not any("__pycache__" in p for p in context)


# ---------------------------------------------------------------- chart values and schema


def test_schema_is_valid_and_the_values_files_satisfy_it() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert schema_errors(VALUES) == []
    for extra in sorted((CHART / "ci").glob("*-values.yaml")):
        merged = deep_merge(VALUES, yaml.safe_load(extra.read_text()))
        assert schema_errors(merged) == [], extra.name


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"gateway": {"replicas": "two"}}, "gateway.replicas"),
        ({"gateway": {"replica": 2}}, "gateway"),
        ({"issuer": {"durability": "always"}}, "issuer.durability"),
        (
            {"issuer": {"routing": "perPod", "autoscaling": {"enabled": True}}},
            "issuer.autoscaling.enabled",
        ),
        ({"gateway": {"auth": {"jwtSecret": "short"}}}, "gateway.auth.jwtSecret"),
        ({"mysql": {"url": "mysql://root@db/x"}}, "mysql.url"),
        ({"redis": {"nodes": "redis-cluster"}}, "redis.nodes"),
        ({"monitoring": {"release": ""}}, "monitoring.release"),
        ({"persister": {"env": {"lower_case": "1"}}}, "persister.env"),
    ],
)
def test_schema_refuses_bad_values_naming_the_field(override: dict[str, Any], field: str) -> None:
    errors = schema_errors(deep_merge(VALUES, override))
    assert errors, f"{override} was accepted"
    assert any(e.startswith(f"{field}:") for e in errors), errors


# ---------------------------------------------------------------- commands and CRD


def chart_commands() -> dict[str, list[str]]:
    """Image values key -> command, from the chart's component table (_helpers.tpl), with the
    template expressions among the arguments dropped. One entry per (image, command)."""
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    commands = {}
    for image, line in re.findall(r"^  image: (\w+)\n  command: \[(.*)\]$", helpers, re.M):
        words = [w.strip() for w in line.split(",")]
        command = [w for w in words if not w.startswith("{{")]
        commands[f"{image}: {' '.join(command)}"] = command
    return commands


def test_every_command_the_chart_runs_exists_in_the_workspace() -> None:
    commands = chart_commands()
    assert len(commands) >= 7  # gateway, issuer, relay, persister, wallet, operator, migrations
    missing = [c for c in commands.values() if command_package(c) is None]
    assert not missing, f"not a console script or module of the workspace: {missing}"


def test_every_command_runs_from_an_image_that_installs_it() -> None:
    image_package = {}  # image values key -> the package its Dockerfile installs
    for artifact in ARTIFACTS:
        (cmd,) = final_stage(ROOT / artifact["docker"]["dockerfile"]).args("CMD")
        key = next(k for k, v in chart_images().items() if v["repository"] == artifact["image"])
        image_package[key] = str(command_package(exec_form(cmd)))
    for where, command in chart_commands().items():
        image = where.split(":")[0]
        assert command_package(command) in installed_by(image_package[image]), where


def test_the_chart_ships_the_canonical_crd() -> None:
    assert CHART_CRD.read_bytes() == CANONICAL_CRD.read_bytes(), (
        f"{CHART_CRD.relative_to(ROOT)} differs from {CANONICAL_CRD.relative_to(ROOT)}, the "
        "canonical copy: edit that one, then run `make sync-crd`"
    )
