"""The layers import top-down, lazy imports inside functions included.

    cli ─► server ─► protocol ─► run_events, jobs, jsonapi, store, config, …
    flows ─► tasks ─┘
    cli, server, flows ─► publish ─► runs, store, config, trainers (names only), artifact_uri
    remote half (potato.training, potato.trainers): nothing of ours above it

The agent protocol has one home (potato/protocol) that both the annotation
server and an ssh run's socket serve, so the flow's tasks never reach into the
web server and the protocol never reaches into either (issue 9, "Also").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module of ours *path* imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("potato", "flows")}


def modules_under(*packages: str) -> dict[str, set[str]]:
    result = {}
    for package in packages:
        base = ROOT.joinpath(*package.split("."))
        paths = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        for path in paths:
            result[module_name(path)] = imports_of(path)
    return result


def offenders(packages: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for module, imported in modules_under(*packages).items():
        for name in sorted(imported):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{module} imports {name}")
    return bad


def test_the_scan_sees_lazy_imports():
    assert "potato.server.commands" in imports_of(ROOT / "potato" / "cli.py")


@pytest.mark.parametrize("packages, forbidden", [
    (("potato.tasks",), ("potato.server",)),
    (("potato.protocol", "potato.jsonapi", "potato.run_events", "potato.jobs"),
     ("potato.server", "potato.tasks", "flows", "potato.cli")),
    (("potato.publish", "potato.artifact_uri"), ("potato.server", "potato.tasks", "potato.protocol", "flows", "potato.cli")),
    (("potato.training", "potato.trainers"),
     ("potato.server", "potato.tasks", "potato.protocol", "potato.store", "potato.config", "potato.runs", "flows")),
])
def test_no_layer_imports_one_above_it(packages, forbidden):
    assert offenders(packages, forbidden) == []
