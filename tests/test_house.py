"""The package's shape, read from its source: at most 5 loose modules at its root (what a
user imports or every layer needs), no module over 600 lines, no function over 100, and no
import circle among its modules, counting the imports made inside functions and under
TYPE_CHECKING (a circle closed that way is still one concept split in two)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "basis_bench"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
MAX_ROOT_MODULES = 5


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file: ``from a.b import c``
    is ``a.b.c`` where c is a module, else ``a.b``; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as its modules in order, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def long_modules(root: Path = PACKAGE) -> list[str]:
    return [
        f"{p.relative_to(root.parent)}: {n} lines"
        for p in _modules(root).values()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]


def long_functions(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in _modules(root).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root.parent)}:{first} {node.name}: {lines}")
    return found


def import_cycle(root: Path = PACKAGE) -> list[str] | None:
    modules = _modules(root)
    return _cycle({m: _imports(m, p, modules) for m, p in modules.items()})


def root_modules(root: Path = PACKAGE) -> list[str]:
    """The package root's loose modules: ``__init__`` and ``__main__`` are the package's own."""
    return sorted(p.stem for p in root.glob("*.py") if p.stem not in ("__init__", "__main__"))


def test_the_package_root_holds_at_most_5_loose_modules():
    assert len(root_modules()) <= MAX_ROOT_MODULES, root_modules()


def test_no_module_is_over_600_lines():
    assert long_modules() == []


def test_no_function_is_over_100_lines():
    assert long_functions() == []


def test_no_import_circle_even_through_function_local_imports():
    assert import_cycle() is None


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"__init__.py": "", **files}.items():
        (root / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "pkg" / name).write_text(text)
    return root / "pkg"


def test_the_checks_find_what_they_look_for(tmp_path):
    """A circle closed by a function-local import, one through TYPE_CHECKING and a submodule
    named by ``from pkg import sub``, a 601-line module and a 101-line function are found."""
    local = _plant(
        tmp_path / "local",
        {"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg.a import x\n"},
    )
    assert import_cycle(local) == ["pkg.a", "pkg.b", "pkg.a"]
    typed = _plant(
        tmp_path / "typed",
        {
            "sub/__init__.py": "",
            "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
            "d.py": "from .sub import c\n",
        },
    )
    assert import_cycle(typed) == ["pkg.d", "pkg.sub.c", "pkg.d"]
    straight = _plant(tmp_path / "straight", {"a.py": "import pkg.b\n", "b.py": "import os\n"})
    assert import_cycle(straight) is None
    body = "".join(f"    x = {i}\n" for i in range(99))
    big = _plant(
        tmp_path / "big",
        {"long.py": "x = 0\n" * 601, "fn.py": f"def f():\n{body}    return x\n"},
    )
    assert long_modules(big) == ["pkg/long.py: 601 lines"]
    assert long_functions(big) == ["pkg/fn.py:1 f: 101"]
    assert long_modules(straight) == long_functions(straight) == []
