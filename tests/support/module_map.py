"""The module map: every module of the project, its layer, and its job (its docstring's first line).

``python -m tests.support.module_map > docs/modules.md`` writes docs/modules.md;
tests/unit/test_layers.py holds the committed page to what this prints, and
every import to the layers below (a layer imports its own and the ones under
it, never one above, and no module imports itself back, through any chain,
function-local imports included).

The layers, top to bottom, and why each sits where it does, are the
``LAYERS`` below; a module belongs to the layer of the longest prefix that
names it. A backend type's package ``__init__`` (its declaration) sits with
the declarations whatever its name, so that a new type needs no line here.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("potato", "flows", "deployments")

# (name, what it holds and why there, module prefixes), top to bottom.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("face", "What people use: the `potato` command and the web server (Training page, admin API), and "
             "runs side by side as both show them.",
     ("potato.cli", "potato.follow", "potato.server", "potato.run_comparison")),
    ("flow", "One run as a Prefect flow, its steps in order; the deployments that start it.",
     ("flows", "deployments")),
    ("steps", "What the flow's steps do: each backend type's steps, check and stop; the agent protocol "
              "both HTTP servers serve; what happens after a run (results, writeback — live into the items' "
              "records too —, the quality gate before it, promote and pin, the stopping signal, retract, evaluation, calibration, "
              "retention, the run's report for Prefect, experiment trackers), publishing a model.",
     ("potato.backends", "potato.protocol", "potato.results", "potato.trainer_hooks", "potato.publish",
      "potato.trackers")),
    ("runs", "The run lifecycle: the store (the truth about runs), the queue, the dispatcher, "
             "reconciliation, ending a run and stopping what it left; a run's events, log, job and "
             "tokens; where its model is; the Prefect glue; the auto-retrain watcher.",
     ("potato.runs",)),
    ("project", "The project: its config (read once, typed) and validation; items, annotators' answers of "
                "every kind, their aggregation, the holdout split and the bundle; which trainer trains which "
                "schema; the shapes of predictions and of what annotators see; the data files' records as "
                "bytes; scores in words and as Markdown.",
     ("potato.config", "potato.validate", "potato.scheme_fields", "potato.trainer_choice", "potato.json_records",
      "potato.items", "potato.annotations", "potato.bundle", "potato.prefill", "potato.text")),
    ("declarations", "What exists, declared without importing it: the backend types and their key "
                     "tables, the vocabulary of a config key, every error class and the names they suggest.",
     ("potato.backend_types", "potato.config_keys",
      "potato.errors", "potato.closest_name")),
    ("remote half", "What an ssh run copies to its host and every worker runs: the worker, the agent, "
                    "the trainers and their registry, the kinds of answer. Standard library only at "
                    "import, Python 3.8; it imports nothing of the layers above.",
     ("potato.training", "potato")),
)
LAYER_NAMES = [name for name, _, _ in LAYERS]

# The modules that sit in potato/ itself, not in a folder, and why each is on its own: every other module
# lives in the folder of its layer (tests/unit/test_layers.py holds potato/ to this list).
FLAT_MODULES: dict[str, str] = {
    "potato.cli": "the `potato` command: every subcommand's arguments, each handed to the module that does it",
    "potato.follow": "a run followed live on the terminal (the CLI's progress line and the end's summary)",
    "potato.run_comparison": "runs side by side, as the CLI prints them and the compare page shows them",
    "potato.validate": "`potato validate`: the config and the items read as a run would, before a server starts",
    "potato.config": "the project's config read once, typed, with every warning and refusal",
    "potato.scheme_fields": "what each annotation type's config holds, as Potato 2.12 reads it",
    "potato.trainer_choice": "which trainer trains which schema, when a run names none or several",
    "potato.json_records": "the data files' records as bytes: read by the config's encoding check, the items "
                           "and the live writeback, below all three",
    "potato.config_keys": "the vocabulary of the config's keys, declared without importing what they configure",
    "potato.errors": "every error class a user can see, and the names they suggest",
    "potato.closest_name": "\"did you mean\": the one rule for every misspelt name",
}
DOCS_COMMAND = "python -m tests.support.module_map > docs/modules.md"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def module_paths() -> dict[str, Path]:
    """Every module of the project: name -> file."""
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def layer_of(name: str, path: Path) -> str:
    best, found = -1, ""
    for layer, _, prefixes in LAYERS:
        for prefix in prefixes:
            # "potato" is the package itself (empty of imports), not everything in it.
            within = name.startswith(prefix + ".") and prefix != "potato"
            if (name == prefix or within) and len(prefix) > best:
                best, found = len(prefix), layer
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project's modules *path* imports, at the top or inside a function (each resolved to a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            # `from potato.backend_types import keys` imports the module keys; `from potato.x import name`, potato.x.
            found.update(submodules or {node.module})
    resolved = set()
    for name in found:
        while name and name not in known:  # `from potato.x import name`: the module, not the name
            name = name.rpartition(".")[0]
        if name:
            resolved.add(name)
    return resolved


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    paths = module_paths()
    return {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each group of modules that import one another, through any chain (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def first_line(path: Path) -> str:
    """The docstring's summary: its first paragraph, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def render() -> str:
    """docs/modules.md."""
    paths = module_paths()
    out = [
        "# The module map",
        "",
        f"<!-- Generated by `{DOCS_COMMAND}`; do not edit by hand. -->",
        "",
        "Every module, by layer, top to bottom, with the first line of its docstring. A layer",
        "imports its own modules and the layers below it, never one above, and no chain of",
        "imports (function-local ones included) comes back to where it started:",
        "tests/unit/test_layers.py holds the code to that, and this page to the code.",
        "docs/architecture.md says why the layers are these.",
        "",
    ]
    for layer, meaning, _ in LAYERS:
        out += [f"## {layer}", "", meaning, "", "| module | what it is |", "|---|---|"]
        for name, path in paths.items():
            if layer_of(name, path) == layer:
                out.append(f"| `{path.relative_to(ROOT).as_posix()}` | {first_line(path).replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render())
