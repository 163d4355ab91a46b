"""The layers import top-down, with no circle, lazy imports inside functions included.

    face (cli, server) ─► flow ─► steps (backends, protocol, results) ─► runs ─► project ─► declarations
                                                                                  ─► remote half

The layers and their modules are the module map's (tests/support/module_map.py,
which writes docs/modules.md). The agent protocol has one home
(potato/protocol) that both the annotation server and an ssh run's socket
serve, so the flow's steps never reach into the web server and the protocol
never reaches into either.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.module_map import (
    DOCS_COMMAND,
    LAYER_NAMES,
    ROOT,
    circles,
    import_graph,
    imports_of,
    layer_of,
    module_paths,
    render,
)


def test_the_scan_sees_lazy_imports():
    paths = module_paths()
    assert "potato.server.commands" in imports_of(ROOT / "potato" / "cli.py", set(paths))


def test_the_scan_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    assert circles(import_graph()) == []


def room_of(name: str) -> str:
    """A module's room: its top-level folder under potato/ (``potato.runs``), or the flat module itself."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (ROOT / "potato" / parts[-1]).is_dir() else name


def test_no_circle_between_rooms():
    # Collapsed to folders and flat modules, the graph may hide a circle no file-level one shows (a folder
    # whose files import, and are imported by, another folder's).
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        if module.startswith("potato."):
            graph.setdefault(room_of(module), set()).update(
                room_of(name) for name in imported if name.startswith("potato.") and room_of(name) != room_of(module))
    assert circles(graph) == []


def test_every_module_has_a_layer_and_a_docstring():
    from tests.support.module_map import first_line

    paths = module_paths()
    assert [name for name, path in paths.items() if not layer_of(name, path)] == []
    assert [name for name, path in paths.items() if not first_line(path) and path.stat().st_size] == []


def test_no_module_imports_a_layer_above_it():
    paths = module_paths()
    rank = {name: LAYER_NAMES.index(layer_of(name, path)) for name, path in paths.items()}
    upward = [f"{module} ({layer_of(module, paths[module])}) imports {name} ({layer_of(name, paths[name])})"
              for module, imported in import_graph().items() for name in sorted(imported)
              if rank[name] < rank[module]]
    assert upward == []


def test_the_remote_half_imports_only_itself():
    paths = module_paths()
    graph = import_graph()
    remote = [name for name, path in paths.items() if layer_of(name, path) == "remote half"]
    assert [f"{m} imports {n}" for m in remote for n in sorted(graph[m])
            if layer_of(n, paths[n]) != "remote half"] == []


def test_reading_the_config_imports_no_backend_code_and_no_web_or_prefect():
    """``potato validate`` reads every backend type's declaration, and nothing of how it runs."""
    script = ("import json, sys; import potato.config; "
              "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('potato', 'flask', 'prefect')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    assert not [m for m in loaded if m.startswith(("flask", "prefect"))]
    assert not [m for m in loaded if m.startswith("potato.backends.") and m.count(".") > 2]  # e.g. .ssh.steps


def test_the_module_map_is_up_to_date():
    committed = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    assert committed == render(), f"docs/modules.md is out of date; regenerate it: {DOCS_COMMAND}"


def test_one_folder_is_one_layer_and_only_the_allowed_modules_are_flat():
    from tests.support.module_map import FLAT_MODULES, LAYERS

    flat = sorted(name for name, path in module_paths().items()
                  if name.startswith("potato.") and name.count(".") == 1 and path.name != "__init__.py")
    assert flat == sorted(FLAT_MODULES), "a module in potato/ itself that is not in FLAT_MODULES: move it into " \
                                         "the folder of its layer, or say in FLAT_MODULES why it stays flat"
    named = [prefix for _, _, prefixes in LAYERS for prefix in prefixes]
    inside_a_folder = [prefix for prefix in named if prefix.count(".") > 1 or (
        prefix.startswith("potato.") and prefix not in FLAT_MODULES and not (ROOT / prefix.replace(".", "/")).is_dir())]
    assert inside_a_folder == [], "the layer map names folders and flat modules, never a module inside a folder"


# Modules a backend type or a trainer has one of each: ``backends/<type>/steps.py``, ``backend_types/<type>.py``
# beside the remote half's ``training/<type>.py``, and a trainer's server hooks named for the trainer.
def _per_type_basenames() -> set[str]:
    from potato.backend_types.type_registry import BACKEND_TYPES
    from potato.training.trainers.registry import TRAINERS

    return {"__init__", "steps", "check", *BACKEND_TYPES, *(name.replace("-", "_") for name in TRAINERS)}


def test_no_basename_repeats_across_folders_but_the_per_type_set():
    by_name: dict[str, list[str]] = {}
    for name in module_paths():
        by_name.setdefault(name.rpartition(".")[2], []).append(name)
    repeated = {base: names for base, names in by_name.items() if len(names) > 1 and base not in _per_type_basenames()}
    assert repeated == {}


def test_no_public_class_is_defined_twice():
    import ast

    defined: dict[str, list[str]] = {}
    for name, path in module_paths().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(name)
    assert {cls: names for cls, names in defined.items() if len(names) > 1} == {}


def test_each_flow_task_calls_the_function_of_the_file_it_is_named_for():
    from tests.support.step_map import flow_tasks

    tasks = flow_tasks()
    assert [t.name for t in tasks][:2] == ["build-bundle", "connect"] and len(tasks) == 10
    assert [t.name for t in tasks if not t.named_for()] == []


def test_the_step_map_in_the_architecture_page_is_up_to_date():
    from tests.support.step_map import committed, render

    assert committed() == render(), "docs/architecture.md's step map is out of date: python -m tests.support.step_map"
