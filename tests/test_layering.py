"""The layering of the package, read from its source (issue 11 item 10).

``layering_violations(root)`` walks every module under a package folder with ``ast`` —
module-level and function-level imports, relative imports resolved, ``TYPE_CHECKING``
blocks included (a type-only import is still a dependency) — and names each import that
breaks a rule:

- no import cycle between modules of the package (a package importing its own children
  and a module its parent packages are not counted: Python runs those anyway);
- a core module (``core``, ``trace``, ``vcs``, ``render``, ``support``, ``errors``) imports no
  runner, executor, workflow or CLI, and no ML framework or Ray;
- a runner imports neither the CLI, the workflows nor the executors;
- the workflows do not import the CLI;
- only ``cli`` imports click;
- no function is longer than 80 lines.

Each rule is proven on small synthetic packages written to ``tmp_path``; the last test
applies them to the package itself.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import reprobisect

MAX_LINES = 80
CORE = ("core", "trace", "vcs", "render", "support", "errors")
FRAMEWORKS = ("torch", "tensorflow", "keras", "lightning", "pytorch_lightning", "jax", "ray")
NOT_FROM_CORE = ("runners", "executors", "workflows", "cli")
NOT_FROM_RUNNERS = ("cli", "workflows", "executors")


@dataclass(frozen=True)
class Import:
    """One import statement's target, as seen from the module that holds it."""

    source: str
    """The importing module (``pkg.core.probe``)."""
    target: str
    """A module of the package (the longest known prefix of the name) or an outside dotted name."""
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name of every module under the package folder ``root`` (packages by their ``__init__``)."""
    out: dict[str, Path] = {}
    for f in sorted(root.rglob("*.py")):
        parts = [root.name, *f.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, modules: dict[str, Path], package: str) -> str:
    """The package module ``name`` lives in (longest known prefix), or ``name`` itself outside it."""
    if name != package and not name.startswith(package + "."):
        return name
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str, path: Path, modules: dict[str, Path], package: str) -> list[Import]:
    """Every import in ``path`` (any depth: functions, classes, ``if`` blocks), resolved."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = {_known(a.name, modules, package) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            # `from pkg import name`: the module pkg.name when there is one, else pkg itself
            base = _absolute(node, module, path.name == "__init__.py")
            inside = base == package or base.startswith(package + ".")
            targets = {_known(f"{base}.{a.name}", modules, package) if inside else base for a in node.names}
        else:
            continue
        out += [Import(module, t, path, node.lineno) for t in sorted(targets) if t and t != module]
    return out


def long_functions(path: Path, max_lines: int = MAX_LINES) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > max_lines:
                out.append(f"{path}:{node.lineno}: function {node.name} is {n} lines long (at most {max_lines})")
    return out


def _in(module: str, package: str, rooms: tuple[str, ...]) -> bool:
    return any(module == f"{package}.{r}" or module.startswith(f"{package}.{r}.") for r in rooms)


def _arrow(imp: Import, package: str) -> str | None:
    """Why ``imp`` breaks an arrow of the layering, or None."""
    src, dst, top = imp.source, imp.target, imp.target.split(".")[0]
    if _in(src, package, CORE):
        if _in(dst, package, NOT_FROM_CORE):
            return "a core module imports no runner, executor, workflow or CLI"
        if top in FRAMEWORKS:
            return "a core module imports no ML framework or Ray"
    if _in(src, package, ("runners",)) and _in(dst, package, NOT_FROM_RUNNERS):
        return "a runner imports neither the CLI, the workflows nor the executors"
    if _in(src, package, ("workflows",)) and _in(dst, package, ("cli",)):
        return "the workflows do not import the CLI"
    if top == "click" and not _in(src, package, ("cli",)):
        return "only the CLI imports click"
    return None


def _cycles(imports: list[Import]) -> list[str]:
    """One named cycle per strongly connected group of modules (Tarjan)."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        a, b = imp.source, imp.target
        if a.startswith(b + ".") or b.startswith(a + "."):
            continue  # a package and its own children
        edges.setdefault(a, {}).setdefault(b, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return [_name_cycle(g, edges) for g in groups]


def _name_cycle(group: list[str], edges: dict[str, dict[str, Import]]) -> str:
    """The shortest cycle through the group's first module, each step with its import's place."""
    start, members = group[0], set(group)
    back: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in edges.get(v, {}):
            if w in members and w not in back:
                back[w] = v
                todo.append(w)
        if start in back:
            break
    path, v = [start], back[start]
    while v != start:
        path.append(v)
        v = back[v]
    path.append(start)
    path.reverse()
    steps = [f"{a} ({edges[a][b].where()}) -> {b}" for a, b in zip(path, path[1:])]
    return "import cycle: " + "; ".join(steps)


def layering_violations(root: Path, max_lines: int = MAX_LINES) -> list[str]:
    """Every broken rule in the package under folder ``root``, one line each, naming the import."""
    package = root.name
    modules = module_names(root)
    imports = [i for name, path in modules.items() for i in imports_of(name, path, modules, package)]
    out = []
    for imp in imports:
        why = _arrow(imp, package)
        if why:
            out.append(f"{imp.where()}: {imp.source} imports {imp.target}: {why}")
    out += _cycles([i for i in imports if i.target in modules])
    for path in modules.values():
        out += long_functions(path, max_lines)
    return out


# ----------------------------------------------------------------------------- synthetic packages
def make_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``reprobisect`` under ``tmp_path`` with ``files`` (relative paths; every folder
    gets an ``__init__.py``)."""
    root = tmp_path / "reprobisect"
    for rel, text in {"__init__.py": "", "errors.py": "class ReproError(Exception): ...\n", **files}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for d in [p.parent, *p.parent.parents]:
            if d == root.parent:
                break
            (d / "__init__.py").touch()
        p.write_text(textwrap.dedent(text))
    return root


CLEAN = {
    "cli/main.py": "import click\nfrom reprobisect.workflows import runs\n",
    "workflows/runs.py": "from reprobisect.executors.local import run\nfrom reprobisect.core import search\n"
                         "from ..vcs import git\nfrom reprobisect.render import text\n",
    "executors/local.py": "from reprobisect.core.search import Bisection\n\ndef run():\n    import ray\n",
    "core/search.py": "from reprobisect.errors import ReproError\n\nclass Bisection: ...\n",
    "core/__init__.py": "from .search import Bisection\n",
    "vcs/git.py": "import git as gitpy\nfrom reprobisect.support import interrupt\n",
    "support/interrupt.py": "import os\n",
    "render/text.py": "from reprobisect.errors import ReproError\n",
    "trace/reader.py": "import numpy\n",
    "runners/torch.py": "import torch\nfrom reprobisect.trace import reader\nfrom reprobisect.errors import ReproError\n",
}


def test_a_clean_package_passes(tmp_path: Path) -> None:
    assert layering_violations(make_package(tmp_path, CLEAN)) == []


@pytest.mark.parametrize("room", ["core/probe.py", "trace/reader.py", "vcs/git.py", "render/text.py",
                                  "support/progress.py", "errors.py"])
@pytest.mark.parametrize("target", ["reprobisect.runners.fresh", "reprobisect.executors.fresh",
                                    "reprobisect.workflows.fresh", "reprobisect.cli.fresh"])
def test_core_imports_no_runner_executor_workflow_or_cli(tmp_path: Path, room: str, target: str) -> None:
    text = f"def late():\n    from {target} import thing\n"  # function level counts too
    fresh = target.removeprefix("reprobisect.").replace(".", "/") + ".py"  # a module nothing else imports
    root = make_package(tmp_path, {**CLEAN, room: text, fresh: ""})
    bad = layering_violations(root)
    assert len(bad) == 1 and f"imports {target}: a core module imports no runner" in bad[0]
    assert bad[0].startswith(f"{root / room}:2:")


@pytest.mark.parametrize("stmt", ["import torch", "from torch import nn", "import tensorflow.keras as K",
                                  "import keras", "import lightning.pytorch", "import pytorch_lightning",
                                  "from jax import numpy", "import ray"])
def test_core_imports_no_framework(tmp_path: Path, stmt: str) -> None:
    top = stmt.split()[1].split(".")[0]
    bad = layering_violations(make_package(tmp_path, {**CLEAN, "core/probe.py": f"def f():\n    {stmt}\n"}))
    assert len(bad) == 1 and f"reprobisect.core.probe imports {top}" in bad[0] and "ML framework" in bad[0]


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    files = {**CLEAN, "core/probe.py": "from ..executors import local\nfrom . import search\n",
             "core/sub/deep.py": "from ...cli.main import x\n"}
    bad = layering_violations(make_package(tmp_path, files))
    assert any("reprobisect.core.probe imports reprobisect.executors.local" in b for b in bad)
    assert any("reprobisect.core.sub.deep imports reprobisect.cli.main" in b for b in bad)
    assert len(bad) == 2  # `from . import search` is core to core: fine


@pytest.mark.parametrize("target", ["reprobisect.cli.main", "reprobisect.workflows.runs", "reprobisect.executors.local"])
def test_a_runner_imports_no_cli_workflow_or_executor(tmp_path: Path, target: str) -> None:
    files = {**CLEAN, "runners/launch.py": f"import torch\nfrom reprobisect.trace import reader\nimport {target}\n"}
    bad = layering_violations(make_package(tmp_path, files))
    assert len(bad) == 1 and f"reprobisect.runners.launch imports {target}: a runner imports" in bad[0]


def test_workflows_do_not_import_the_cli(tmp_path: Path) -> None:
    bad = layering_violations(make_package(tmp_path, {**CLEAN, "workflows/demo.py": "from reprobisect.cli import main\n"}))
    assert len(bad) == 1 and "reprobisect.workflows.demo imports reprobisect.cli.main: the workflows" in bad[0]


@pytest.mark.parametrize("where", ["workflows/runs.py", "core/options.py", "executors/ray.py", "__main__.py"])
def test_only_the_cli_imports_click(tmp_path: Path, where: str) -> None:
    bad = layering_violations(make_package(tmp_path, {**CLEAN, where: "def deco():\n    import click.types\n"}))
    assert len(bad) == 1 and "imports click.types: only the CLI imports click" in bad[0]
    assert layering_violations(make_package(tmp_path / "ok", {**CLEAN, "cli/commands/runs.py": "import click\n"})) == []


def test_an_import_cycle_is_named_with_its_imports(tmp_path: Path) -> None:
    files = {**CLEAN,
             "core/compare.py": "from reprobisect.render.text import show\n",
             "render/text.py": "def show():\n    from reprobisect.core import compare\n"}
    bad = layering_violations(make_package(tmp_path, files))
    assert len(bad) == 1 and bad[0].startswith("import cycle: ")
    assert "reprobisect.core.compare (" in bad[0] and "compare.py:1) -> reprobisect.render.text" in bad[0]
    assert "text.py:2) -> reprobisect.core.compare" in bad[0]
    longer = {**CLEAN, "core/a.py": "from . import b\n", "core/b.py": "from .c import x\n", "core/c.py": "import reprobisect.core.a\n"}
    bad = layering_violations(make_package(tmp_path / "three", longer))
    assert len(bad) == 1 and bad[0].count("->") == 3


def test_a_package_importing_its_children_is_no_cycle(tmp_path: Path) -> None:
    files = {**CLEAN, "core/__init__.py": "from .search import Bisection\nfrom . import probe\n",
             "core/probe.py": "from reprobisect.core import search\n"}
    assert layering_violations(make_package(tmp_path, files)) == []


def test_functions_longer_than_80_lines(tmp_path: Path) -> None:
    def func(name: str, body_lines: int, indent: str = "") -> str:
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x = {i}\n" for i in range(body_lines))

    files = {**CLEAN, "core/long.py": func("ok", 79) + func("too_long", 80) + "class C:\n" + func("method", 85, "    ")}
    bad = layering_violations(make_package(tmp_path, files))
    assert len(bad) == 2
    assert any("long.py:81: function too_long is 81 lines long" in b for b in bad)
    assert any("function method is 86 lines long" in b for b in bad)


# ----------------------------------------------------------------------------- the package itself
def test_the_package_keeps_its_layering() -> None:
    bad = layering_violations(Path(reprobisect.__file__).parent)
    assert not bad, f"{len(bad)} layering violations:\n" + "\n".join(bad)
