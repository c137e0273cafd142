"""The package's layout keeps imports running one way: no module imports another that imports it back, lazy imports
inside functions included (a lazy import hides a circle; it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import rlfleet

ROOT = Path(rlfleet.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The rlfleet modules a file imports anywhere in it: `import a.b`, `from a import b` (a.b when b is a module)."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, up level - 1
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules}


def test_no_module_imports_one_that_imports_it_back():
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {name: imports_of(path, set(files)) - {name} for name, path in files.items()}
    assert len(graph) > 50 and graph["rlfleet.launch"], "the walk found the package and its imports"
    circles = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph[b]})
    assert not circles, f"modules that import each other: {circles}"
