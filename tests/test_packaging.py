"""Every third-party package this repository imports is declared in pyproject.toml, where
the code importing it gets it (docs/install.md):

    package                                   may import what is declared in
    prism_wire, prism_tokens, prism_proxy,    the runtime `dependencies`
      prism_sim
    loadgen                                   the runtime, the `loadgen` extra
    backend_plugin, sglang_cpu                the runtime, the `sglang` extra
    bench, tests, scripts                     the runtime and every extra

An import guarded by `except ImportError` (an optional feature) may come from any extra,
and so may the package's other imports of that module; one under `if TYPE_CHECKING:` is
never run and not counted. And the other way round: every runtime dependency is imported
by the runtime's code, so a plain `pip install .` (the proxy's image) pulls nothing it
does not use.

Imports are read with `ast`; an import name maps to its distribution through
`importlib.metadata.packages_distributions()` (this environment's), or is its own name
when not installed here (sglang, torch, transformers outside .venv-sglang).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = "runtime"
RUNTIME_PACKAGES = ("prism_wire", "prism_tokens", "prism_proxy", "prism_sim")
# where the code is -> the groups of pyproject.toml it may import from (None: all)
ALLOWED: dict[str, tuple[str, ...] | None] = {
    **{name: (RUNTIME,) for name in RUNTIME_PACKAGES},
    "loadgen": (RUNTIME, "loadgen"),
    "backend_plugin": (RUNTIME, "sglang"),
    "sglang_cpu": (RUNTIME, "sglang"),
    "bench": None,
    "tests": None,
    "scripts": None,
}
OWN_PACKAGES = frozenset(ALLOWED)


def normalize(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_groups(pyproject: dict) -> dict[str, set[str]]:
    """group (`runtime` or an extra's name) -> its distributions, normalized; an extra
    naming this project's own extras (`prism-serving[loadgen]`) holds theirs too."""
    project = pyproject["project"]
    own = normalize(project["name"])
    raw = {RUNTIME: project["dependencies"], **project["optional-dependencies"]}

    def expand(group: str) -> set[str]:
        names: set[str] = set()
        for requirement in raw[group]:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
            assert match, requirement
            name, extras = normalize(match.group(1)), match.group(2)
            if name == own:
                for extra in (extras or "").split(","):
                    names |= expand(extra.strip())
            else:
                names.add(name)
        return names

    return {group: expand(group) for group in raw}


@dataclass(frozen=True)
class Import:
    module: str  # the top-level import name
    path: Path
    line: int
    optional: bool  # inside `try: ... except ImportError`


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = ("ImportError", "ModuleNotFoundError")
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(kind, ast.Name) and kind.id in names for kind in kinds)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@functools.cache
def imports_of(path: Path) -> tuple[Import, ...]:
    """The absolute imports of one file, each with whether it is optional (each file
    parsed once for all the tests here)."""
    return tuple(_imports_of(path))


@functools.cache
def installed_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _imports_of(path: Path) -> Iterator[Import]:

    def visit(node: ast.AST, optional: bool) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (i for child in node.orelse for i in visit(child, optional))
            return
        if isinstance(node, ast.Try):
            guarded = optional or any(_catches_import_error(h) for h in node.handlers)
            for child in node.body:
                yield from visit(child, guarded)
            for child in (*node.handlers, *node.orelse, *node.finalbody):
                yield from visit(child, optional)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name.split(".")[0], path, node.lineno, optional)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield Import(node.module.split(".")[0], path, node.lineno, optional)
        for child in ast.iter_child_nodes(node):
            yield from visit(child, optional)

    yield from visit(ast.parse(path.read_text(), str(path)), False)


def local_modules(where: Path) -> set[str]:
    """Module names a directory's files import as their own (tests' helper modules)."""
    return {p.stem for p in where.rglob("*.py")} | {p.name for p in where.rglob("*") if p.is_dir()}


def third_party_imports(where: str) -> Iterator[Import]:
    """The third-party imports of one package (or directory). A module it imports under
    `except ImportError` anywhere is optional in all of it: its other imports run only
    where the guarded one found it (e.g. OpenTelemetry's, once a tracer exists)."""
    directory = ROOT / where
    local = local_modules(directory) | OWN_PACKAGES
    found = [
        each
        for path in sorted(directory.rglob("*.py"))
        for each in imports_of(path)
        if each.module not in sys.stdlib_module_names and each.module not in local
    ]
    optional = {each.module for each in found if each.optional}
    for each in found:
        yield replace(each, optional=True) if each.module in optional else each


def distributions_of(module: str, installed: dict[str, list[str]]) -> set[str]:
    """The distributions providing a top-level module: several for a namespace package
    (`opentelemetry`: -api, -sdk, ...), where declaring one of them is enough."""
    return {normalize(name) for name in installed.get(module) or [module]}


def test_every_imported_package_is_declared_where_it_is_imported() -> None:
    groups = declared_groups(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    every_extra = set().union(*groups.values())
    installed = installed_distributions()
    undeclared = []
    for where, allowed in ALLOWED.items():
        may = every_extra if allowed is None else set().union(*(groups[g] for g in allowed))
        for found in third_party_imports(where):
            distributions = distributions_of(found.module, installed)
            if not distributions & (every_extra if found.optional else may):
                place = f"{found.path.relative_to(ROOT)}:{found.line}"
                wanted = "any extra" if found.optional or allowed is None else " or ".join(allowed)
                names = ", ".join(sorted(distributions))
                undeclared.append(f"{place}: {found.module} ({names}), not in {wanted}")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(undeclared)


def test_the_runtime_declares_only_what_the_runtime_imports() -> None:
    """A plain `pip install .` (the proxy's image) installs nothing the proxy and the
    simulated engine do not import."""
    groups = declared_groups(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    installed = installed_distributions()
    imported = {
        distribution
        for where in RUNTIME_PACKAGES
        for found in third_party_imports(where)
        for distribution in distributions_of(found.module, installed)
    }
    assert groups[RUNTIME] - imported == set()


def test_the_runtime_packages_import_no_tooling_of_this_repository() -> None:
    """prism_proxy and prism_sim never reach into loadgen, bench or the SGLang side,
    whose imports the runtime install does not have."""
    reaching = [
        f"{found.path.relative_to(ROOT)}:{found.line}: {found.module}"
        for where in RUNTIME_PACKAGES
        for found in imports_of_tree(ROOT / where)
        if found.module in OWN_PACKAGES and found.module not in RUNTIME_PACKAGES
    ]
    assert reaching == []


def imports_of_tree(directory: Path) -> Iterator[Import]:
    for path in sorted(directory.rglob("*.py")):
        yield from imports_of(path)


def test_the_scan_sees_what_it_checks(tmp_path: Path) -> None:
    """The scanner itself: plain, nested, optional and type-only imports."""
    source = tmp_path / "m.py"
    source.write_text(
        "import numpy.linalg\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import pandas\n"
        "def f():\n    from matplotlib import pyplot\n"
        "try:\n    import opentelemetry.trace\nexcept ImportError:\n    pass\n"
        "from . import sibling\n"
    )
    found = {(i.module, i.optional) for i in imports_of(source)}
    assert found == {("numpy", False), ("typing", False), ("matplotlib", False),
                     ("opentelemetry", True)}  # fmt: skip
    groups = declared_groups(
        {
            "project": {
                "name": "prism-serving",
                "dependencies": ["aiohttp>=3.14,<3.15"],
                "optional-dependencies": {
                    "loadgen": ["numpy>=1.26", "Py_Spy"],
                    "dev": ["prism-serving[loadgen]", "pytest"],
                },
            }
        }
    )
    assert groups == {
        RUNTIME: {"aiohttp"},
        "loadgen": {"numpy", "py-spy"},
        "dev": {"numpy", "py-spy", "pytest"},
    }


def _loadgen_cli(runs: list[list[str]]) -> list[dict]:
    """`prism-loadgen ARGS` for each of `runs`, in one fresh interpreter where the
    loadgen extra's modules cannot be imported (as after a plain `pip install .`):
    each run's exit code, stdout and stderr."""
    from loadgen.cli import LOADGEN_EXTRA_MODULES

    code = (
        "import contextlib, io, json, sys\n"
        f"for name in {sorted(LOADGEN_EXTRA_MODULES)!r}:\n"
        "    sys.modules[name] = None  # import fails: ModuleNotFoundError\n"
        "from loadgen.cli import main\n"
        "results = []\n"
        f"for args in {runs!r}:\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            code = main(args)\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "    results.append({'code': code, 'out': out.getvalue(), 'err': err.getvalue()})\n"
        "print(json.dumps(results))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cli_knows_the_loadgen_extra() -> None:
    """The modules `prism-loadgen` names as the extra's are the extra's distributions."""
    from loadgen.cli import LOADGEN_EXTRA_MODULES

    groups = declared_groups(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert {normalize(name) for name in LOADGEN_EXTRA_MODULES} == groups["loadgen"]


def test_prism_loadgen_help_runs_without_the_loadgen_extra(tmp_path: Path) -> None:
    """The must-show's `prism-loadgen --help` after `pip install .` (bench/fresh_install.py
    checks it in a real fresh venv), and a subcommand that needs the extra names it."""
    out = str(tmp_path / "t.jsonl")
    runs = [["--help"], ["sweep", "--help"], ["trace", "rag", "--help"]]
    help_, sweep, rag, trace = _loadgen_cli([*runs, ["trace", "rag", "--out", out]])
    assert help_["code"] == 0 and "replay" in help_["out"] and "sweep" in help_["out"]
    assert sweep["code"] == 0 and "--policies" in sweep["out"]
    assert rag["code"] == 0 and "hot_set [20]" in rag["out"]
    assert trace["code"] == 2
    assert "'trace' needs 'numpy'" in trace["err"]
    assert "pip install 'prism-serving[loadgen]'" in trace["err"]
