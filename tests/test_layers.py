"""The package's layers (planner/__init__.py): every module's imports, eager or inside a
function, run downward only; the pure layers import no I/O, rendering or ML library and never
print or open files; the core imports fast."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PLANNER = Path(__file__).resolve().parent.parent / "planner"

# Rank of each layer: a module may import its own layer and those of a lower rank. search and
# evidence share a rank, so neither may import the other.
RANKS = {"core": 0, "layouts": 1, "serving": 2, "evidence": 3, "search": 3, "io": 4, "cli": 5,
         "ui": 6}
TOP = 7  # planner/__init__.py and __main__.py stand above every layer
# The one upward import: the `llmplan ui` command (a cli module) starts the web page's server,
# which stands above the cli because it calls the commands' own functions.
STARTS = {"planner.cli.ui": "ui"}
PURE = {"core", "layouts", "serving"}
IMPURE_MODULES = {"torch", "pandas", "matplotlib", "rich", "yaml", "typer", "numpy", "pyarrow",
                  "prometheus_client", "harness", "os", "subprocess", "socket", "urllib",
                  "http", "pathlib", "shutil", "io", "json", "csv"}
IMPURE_CALLS = {"print", "open", "input"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PLANNER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """'planner.core.ops' -> 'core'; None for the package's top modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANKS) else None


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the tree, relative ones resolved; for
    ``from pkg import name`` the module ``pkg.name`` when that is a module, else ``pkg``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            for a in node.names:
                sub = f"{base}.{a.name}"
                is_module = (PLANNER.parent / Path(*sub.split("."))).with_suffix(".py").exists() \
                    or (PLANNER.parent / Path(*sub.split(".")) / "__init__.py").exists()
                out.append((node.lineno, sub if is_module else base))
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """What in one module's source breaks the layer rules, one line each."""
    tree = ast.parse(source)
    layer = layer_of(module)
    rank = RANKS[layer] if layer else TOP
    found = []
    for line, target in imported_modules(tree, module, is_package):
        root = target.split(".")[0]
        if root == "harness":
            found.append(f"{module}:{line} imports {target}: planner never imports the harness")
        if layer in PURE and root in IMPURE_MODULES:
            found.append(f"{module}:{line} imports {target} in the pure layer {layer}/")
        if root != "planner" or target in ("planner", "planner.__init__"):
            continue
        other = layer_of(target)
        if other is None:
            if target != "planner.__main__":
                continue  # planner's own top: __version__
            found.append(f"{module}:{line} imports {target}")
        elif other != layer and RANKS[other] >= rank and STARTS.get(module) != other:
            found.append(f"{module}:{line} imports {target}: {layer or 'planner'} "
                         f"(rank {rank}) may not import {other} (rank {RANKS[other]})")
    if layer in PURE:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in IMPURE_CALLS:
                found.append(f"{module}:{node.lineno} calls {node.func.id}() in the pure "
                             f"layer {layer}/")
    return found


def all_modules() -> list[Path]:
    return sorted(PLANNER.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    loose = [p.name for p in PLANNER.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside the layers: {loose}"
    folders = {p.name for p in PLANNER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(RANKS), folders


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(PLANNER)))
def test_imports_run_downward(path):
    assert violations(path.read_text(), module_name(path), path.name == "__init__.py") == []


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("planner.core.ops", "from planner.serving.sim import simulate\n", "may not import serving"),
    ("planner.core.ops", "def f():\n    from planner.io import catalog\n", "may not import io"),
    ("planner.layouts.expert", "import planner.search.sweep\n", "may not import search"),
    ("planner.search.plan", "from planner.evidence import validate\n", "may not import evidence"),
    ("planner.evidence.fit", "from planner.search.sweep import Grid\n", "may not import search"),
    ("planner.io.report", "from planner.cli.options import stdout\n", "may not import cli"),
    ("planner.serving.sim", "import pandas as pd\n", "pure layer serving"),
    ("planner.core.memory", "def f():\n    print('x')\n", "calls print()"),
    ("planner.layouts.pipeline", "with open('x') as f:\n    pass\n", "calls open()"),
    ("planner.io.catalog", "import harness.device\n", "never imports the harness"),
    ("planner.serving.cost", "from ..io import catalog\n", "may not import io"),
    ("planner.cli.estimate", "from planner.ui import api\n", "may not import ui"),
])
def test_a_wrong_way_import_is_caught(module, source, expected):
    found = violations(source, module)
    assert len(found) == 1 and expected in found[0], found


def test_a_downward_import_is_allowed():
    assert violations("from planner.core.ops import decode_ops\n"
                      "from planner.serving.sim import simulate\n",
                      "planner.evidence.compare") == []
    assert violations("from planner.io import catalog\nimport pandas\n",
                      "planner.cli.estimate") == []


def test_the_core_imports_no_heavy_library():
    """The pure layers in a fresh interpreter: none of the heavy or I/O libraries is loaded."""
    mods = [module_name(p) for p in all_modules() if layer_of(module_name(p)) in PURE]
    code = (f"import sys, importlib; [importlib.import_module(m) for m in {mods!r}]; "
            "print([m for m in ('torch', 'yaml', 'rich', 'typer', 'pandas', 'matplotlib', "
            "'numpy') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
