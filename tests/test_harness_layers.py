"""The harness in three layers, imports only downward (docs/ARCHITECTURE.md): analysis is pure
(no rich, no matplotlib, no file writes), measuring and showing never import each other, and
nothing in the harness reaches into the engine's worker: it reads the engine's wire modules.

Read from the source (every import statement, function-level ones included), so a lazy import
cannot slip past."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"

# harness part -> the harness parts it must not import
ABOVE_ALL = ("harness.commands", "harness.cli")
FORBIDDEN = {
    "harness.analysis": ("harness.measure", "harness.show", "harness.results", *ABOVE_ALL),
    "harness.measure": ("harness.show", *ABOVE_ALL),
    "harness.show": ("harness.measure", "harness.results", *ABOVE_ALL),
    "harness.results": ("harness.measure", "harness.show", *ABOVE_ALL),
    "harness.errors": ("harness.",),
}
PRINTERS = ("rich", "matplotlib", "typer")
# What writes (or deletes) files: modules, and methods of paths, frames, figures and tables.
WRITING_MODULES = ("os", "shutil", "tempfile", "subprocess", "pickle", "pyarrow", "pathlib.Path")
WRITING_CALLS = set(
    "open write_text write_bytes mkdir touch unlink rmdir to_parquet to_pickle to_feather"
    " to_excel savefig dump write_table".split()
)
WRITING_WITH_A_PATH = {"to_csv", "to_json"}  # without one they return text


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST, module: str) -> list[str]:
    """Every module an import statement names (`from a import b` names a and a.b)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            out += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return out


def writes(tree: ast.AST, module: str) -> list[str]:
    """What in a module's source writes files: a writing module imported, a writing call."""
    found = [
        name
        for name in imports(tree, module)
        if any(name == w or name.startswith(w + ".") for w in WRITING_MODULES)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            given = node.args or node.keywords
            if name in WRITING_CALLS or (name in WRITING_WITH_A_PATH and given):
                found.append(f"{name}() at line {node.lineno}")
    return found


def sources(package: Path = HARNESS) -> list[tuple[str, ast.AST]]:
    return [(module_name(p), ast.parse(p.read_text())) for p in sorted(package.rglob("*.py"))]


def within(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def test_every_layer_imports_only_downward():
    wrong = []
    for module, tree in sources():
        for part, banned in FORBIDDEN.items():
            if within(module, part):
                wrong += [
                    f"{module} imports {n}" for n in imports(tree, module) if n.startswith(banned)
                ]
    assert not wrong, "\n".join(wrong)


def test_analysis_neither_prints_nor_plots_nor_writes_files():
    analysis = sources(HARNESS / "analysis")
    assert len(analysis) >= 8
    wrong = []
    for module, tree in analysis:
        for name in imports(tree, module):
            if name.split(".")[0] in PRINTERS:
                wrong.append(f"{module} imports {name}")
        wrong += [f"{module} writes files: {what}" for what in writes(tree, module)]
    assert not wrong, "\n".join(wrong)


def test_no_harness_module_imports_the_engines_worker():
    """The harness reads the engine through its wire (engine/spans.py, engine/messages.py,
    engine/env.py) and its configuration, never engine.worker."""
    wrong = [
        f"{module} imports {name}"
        for module, tree in sources()
        for name in imports(tree, module)
        if within(name, "engine.worker")
    ]
    assert not wrong, "\n".join(wrong)


def test_every_import_of_this_repository_names_a_module_in_it():
    """A module moved or removed leaves no import behind (an editable install of another
    checkout would otherwise answer it)."""
    wrong = []
    for module, tree in sources():
        for name in imports(tree, module):
            if not name.startswith(("harness.", "engine.")):
                continue
            path = ROOT / name.replace(".", "/")
            if not (path.with_suffix(".py").exists() or (path / "__init__.py").exists()):
                parent = ROOT / name.rpartition(".")[0].replace(".", "/")
                # `from package.module import name`: the name is the module's, not a file
                if not (parent.with_suffix(".py").exists() or (parent / "__init__.py").exists()):
                    wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "source, found",
    [
        ("import rich.table", "imports rich.table"),
        ("def f():\n    from matplotlib import pyplot", "imports matplotlib"),
        ("from pathlib import Path", "writes files: pathlib.Path"),
        ("def f(p):\n    p.write_text('x')", "writes files: write_text()"),
        ("def f(frame, p):\n    frame.to_parquet(p)", "writes files: to_parquet()"),
        ("def f(frame, p):\n    frame.to_csv(p)", "writes files: to_csv()"),
        ("def f():\n    open('x', 'w')", "writes files: open()"),
    ],
)
def test_the_purity_check_catches_what_it_looks_for(source, found):
    tree = ast.parse(source)
    wrong = [f"imports {n}" for n in imports(tree, "harness.analysis.x") if n.startswith(PRINTERS)]
    wrong += [f"writes files: {what}" for what in writes(tree, "harness.analysis.x")]
    assert any(found in w for w in wrong), wrong
