"""The package's shape, checked from the source: module sizes, imports pointing down, and no
module reaching into another eva module's private names."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernel_independent

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "eva"
MAX_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_FMT_SKIPS = 3
# a function over MAX_FUNCTION_LINES needs this comment line directly above it (or its decorators)
NOT_CUT = "# Not cut:"
# the one module allowed to use a library's private API (with a canary test of its own)
PRIVATE_API_SHIMS = {"upload/paramiko_compat.py"}
# which top-level parts of eva each layer may import (imports point down the dataflow)
LOWER: dict[str, set[str]] = {
    "dataset": {"dataset", "_native", "progress", "timestamps", "libc", "textsafe"},
    "quality": {"dataset", "quality", "_native", "progress", "timestamps", "libc", "textsafe"},
    "formats": {"dataset", "formats", "_native", "progress", "timestamps", "libc", "textsafe"},
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _imported_eva_modules(tree: ast.Module) -> dict[str, str]:
    """alias -> dotted eva module, for ``import eva.x as y`` and ``from eva.x import module``."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("eva"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eva"):
            for a in node.names:
                source = PACKAGE.parent / node.module.replace(".", "/")
                if (source / f"{a.name}.py").exists() or (source / a.name).is_dir():
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def test_no_module_is_longer_than_600_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_module_reads_another_modules_private_names() -> None:
    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in PRIVATE_API_SHIMS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = _imported_eva_modules(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eva"):
                source = PACKAGE.parent / node.module.replace(".", "/")
                for a in node.names:
                    private = a.name.startswith("_") and not a.name.startswith("__")
                    # a package's private module (eva._native, formats._verify) is its own
                    is_module = (source / f"{a.name}.py").exists() or (source / a.name).is_dir()
                    if private and not is_module:
                        found.append(f"{rel}:{node.lineno}: from {node.module} import {a.name}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                found.append(f"{rel}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    assert not found, found


def test_lower_layers_import_nothing_above_them() -> None:
    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0] if len(rel.parts) > 1 else None
        if layer not in LOWER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eva."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("eva.")]
            for name in names:
                top = name.split(".")[1]
                if top not in LOWER[layer]:
                    found.append(f"{rel}:{node.lineno}: imports {name}")
    assert not found, found


# formats/ modules that are no format: what every format shares, and the catalogue (which
# names each built-in format for mypy's check of its module against catalog.Format)
SHARED_FORMAT_MODULES = {"base", "options", "tasks", "catalog"}


def test_formats_never_import_each_other() -> None:
    formats = PACKAGE / "formats"
    names = {p.stem for p in formats.iterdir() if not p.name.startswith("_")}
    names -= {*SHARED_FORMAT_MODULES, "__pycache__"}
    found = []
    for path in formats.rglob("*.py"):
        own = path.relative_to(formats).parts[0].removesuffix(".py")
        if own == "catalog":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                other = parts[2] if parts[:2] == ["eva", "formats"] and len(parts) > 2 else own
                if other in names and other != own:
                    found.append(f"{path.relative_to(PACKAGE)}: imports {node.module}")
    assert not found, found


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_fmt_skip_packs_no_function_and_stays_rare() -> None:
    """``# fmt: skip`` packs code past the formatter; cut at a seam instead."""
    markers: list[str] = []
    in_functions: list[str] = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        lines = [
            tok.start[0]
            for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT and "fmt: skip" in tok.string
        ]
        if not lines:
            continue
        spans = [(f.lineno, f.end_lineno or f.lineno) for f in _functions(ast.parse(text))]
        rel = path.relative_to(PACKAGE).as_posix()
        for line in lines:
            markers.append(f"{rel}:{line}")
            if any(start <= line <= end for start, end in spans):
                in_functions.append(f"{rel}:{line}")
    assert not in_functions, in_functions
    assert len(markers) <= MAX_FMT_SKIPS, markers


def test_long_functions_say_why_they_are_not_cut() -> None:
    long = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for f in _functions(ast.parse(text)):
            length = (f.end_lineno or f.lineno) - f.lineno + 1
            top = min([d.lineno for d in f.decorator_list] + [f.lineno])
            explained = top >= 2 and lines[top - 2].strip().startswith(NOT_CUT)
            if length > MAX_FUNCTION_LINES and not explained:
                long.append(f"{path.relative_to(PACKAGE)}:{f.lineno} {f.name} ({length} lines)")
    assert not long, long


# ---- the console page: plain ES modules under console/static, no build step ---------------

STATIC = PACKAGE / "console" / "static"
ENTRY = "app.js"  # the one script index.html loads; it imports everything else
# import/export ... from "x", import "x", import("x"): the module a statement names
_JS_IMPORT = re.compile(
    r"""^\s*(?:import|export)\b[^;"'`]*?\bfrom\s*["']([^"']+)["']"""
    r"""|^\s*import\s*["']([^"']+)["']|\bimport\(\s*["']([^"']+)["']""",
    re.MULTILINE,
)


def _scripts() -> list[Path]:
    return sorted(STATIC.rglob("*.js"))


def _js_imports(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [next(g for g in m.groups() if g) for m in _JS_IMPORT.finditer(text)]


def test_no_console_script_is_longer_than_600_lines() -> None:
    assert _scripts()
    long = {
        str(p.relative_to(STATIC)): n
        for p in _scripts()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


def test_the_page_loads_its_code_as_one_module() -> None:
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    tags = re.findall(r"<script\b[^>]*>", page)
    assert tags == [f'<script type="module" src="/static/{ENTRY}">'], tags
    assert "<script>" not in page.replace(tags[0], "")  # no inline code (the policy forbids it)


def test_every_console_import_resolves_and_every_script_is_imported() -> None:
    """Each import names a file of static/ by a relative path (a browser resolves no bare
    name without a build step), and each script is reached from the entry."""
    bad = []
    reached = {(STATIC / ENTRY).resolve()}
    todo = [(STATIC / ENTRY).resolve()]
    while todo:
        path = todo.pop()
        rel = path.relative_to(STATIC).as_posix()
        for name in _js_imports(path):
            target = (path.parent / name).resolve()
            if not name.startswith(("./", "../")) or not name.endswith(".js"):
                bad.append(f"{rel}: {name!r} is not a relative path to a .js file")
            elif not target.is_file() or not target.is_relative_to(STATIC.resolve()):
                bad.append(f"{rel}: {name!r} names no file of static/")
            elif target not in reached:
                reached.add(target)
                todo.append(target)
    assert not bad, bad
    unreached = [p.relative_to(STATIC).as_posix() for p in _scripts() if p.resolve() not in reached]
    assert not unreached, f"scripts no module imports: {unreached}"


def test_shared_console_modules_import_no_panel() -> None:
    """lib/ is what every panel shares; a panel reaches another only through lib/panels.js."""
    shared = STATIC / "lib"
    found = [
        f"{path.relative_to(STATIC).as_posix()}: {name}"
        for path in sorted(shared.glob("*.js"))
        for name in _js_imports(path)
        if not (path.parent / name).resolve().is_relative_to(shared)
    ]
    assert not found, found
