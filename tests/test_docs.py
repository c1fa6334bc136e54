"""The documentation stays true: the site builds strictly, every Python block in it
runs as pasted, every command it shows exists, every test it cites exists, the CLI
reference is current, and the architecture's layer table matches the imports."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from flowdrop_local import Store
from flowdrop_local.cli import cli

from ._cli_reference import page as cli_reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


def _blocks(path: Path, *languages: str) -> list[str]:
    found = FENCE.findall(path.read_text(encoding="utf-8"))
    return [body for lang, body in found if lang in languages]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ----------------------------------------------------------------- the site


@pytest.mark.timeout(600)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a page left out of the nav, a bad
    docstring section or a missing anchor fails the build, and so this test."""
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("Buffer.append", "Store.buffer", "AsyncBuffer.append", "syncing.sync"):
        assert name in reference, f"{name} is missing from the generated reference"


def test_the_readme_is_short_and_links_into_the_docs() -> None:
    """The README fits on a few screens (5-8 KB) and every page it links to exists."""
    text = README.read_text(encoding="utf-8")
    assert 3 * 1024 <= len(text.encode()) <= 8 * 1024
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 8
    for link in links:
        assert (ROOT / link).is_file(), link


# ------------------------------------------------------------- code blocks

_PYTHON_PAGES = [page for page in [README, *PAGES] if _blocks(page, "python")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", _PYTHON_PAGES, ids=_name)
def test_every_python_block_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A page's Python blocks run as pasted, in order, in one namespace, in an empty
    folder. A PostgreSQL URL in a block is the suite's own server (a fresh schema)."""
    blocks = _blocks(page, "python")
    if any("postgresql://" in block for block in blocks):
        url = request.getfixturevalue("postgresql_url")
        blocks = [re.sub(r"\"postgresql://[^\"]*\"", repr(url), block) for block in blocks]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs"}
    try:
        for number, block in enumerate(blocks, 1):
            exec(compile(block, f"{_name(page)}, block {number}", "exec"), namespace)
    finally:
        for value in namespace.values():
            if isinstance(value, Store):
                value.close()  # closing a closed store is a no-op


def _command(words: list[str]) -> tuple[click.Command, list[click.Command]]:
    """The click command ``flowdrop-local WORDS...`` names, and the chain above it."""
    command: click.Command = cli
    chain = [command]
    for word in words:
        if not isinstance(command, click.Group) or word not in command.commands:
            break
        command = command.commands[word]
        chain.append(command)
    return command, chain


def _shell_lines() -> list[tuple[str, str]]:
    found = []
    for page in [README, *PAGES]:
        for block in _blocks(page, "sh", "text", ""):
            for line in block.splitlines():
                line = line.removeprefix("$ ").strip()
                if line.startswith(("flowdrop-local ", "python -m ", "pip install ")):
                    found.append((_name(page), line))
    return found


def test_every_command_shown_exists() -> None:
    """Each ``flowdrop-local ...`` line names a command and only options it has; each
    ``python -m X`` names a module; each ``pip install '.[extra]'`` an extra."""
    lines = _shell_lines()
    assert len(lines) >= 10
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    problems = []
    for where, line in lines:
        for part in line.split("&&"):
            words = shlex.split(part.split("#", 1)[0])
            if not words:
                continue
            if words[0] == "flowdrop-local":
                command, chain = _command([w for w in words[1:] if not w.startswith("-")])
                known = {o for c in chain for p in c.params for o in (*p.opts, *p.secondary_opts)}
                known |= {"--help"}
                for word in words[1:]:
                    option = word.strip("[]").split("=", 1)[0]
                    if option.startswith("-") and option not in known:
                        problems.append(f"{where}: {line!r}: {command.name} has no {option}")
            elif words[:2] == ["python", "-m"]:
                if importlib.util.find_spec(words[2]) is None:
                    problems.append(f"{where}: {line!r}: no module {words[2]}")
            elif words[:2] == ["pip", "install"]:
                for extra in re.findall(r"\.\[([\w,-]+)\]", part):
                    for name in extra.split(","):
                        if name not in extras:
                            problems.append(f"{where}: {line!r}: no extra {name}")
    assert problems == []


# ------------------------------------------------------------- what it cites


def _cited_tests() -> list[tuple[str, str, str]]:
    """(page, file, test name) for each `file.py::test_x` and `::test_y` cited; a
    name ending in ``*`` (``test_mem1_*``) stands for the tests it begins."""
    cited = []
    for page in [README, *PAGES]:
        for line in page.read_text(encoding="utf-8").splitlines():
            current = None
            for match in re.finditer(r"(?:(test_\w+\.py))?::(test_\w+)(\*)?", line):
                current = match.group(1) or current
                assert current, f"{_name(page)}: a citation without its file: {line!r}"
                cited.append((_name(page), current, match.group(2) + (match.group(3) or "")))
    return cited


def test_every_cited_test_exists() -> None:
    """Each test the docs name is defined in the file they name."""
    cited = _cited_tests()
    assert len(cited) > 100
    missing = []
    for page, file, name in cited:
        source = (ROOT / "tests" / file).read_text(encoding="utf-8")
        pattern = rf"def {name[:-1]}" if name.endswith("*") else rf"def {name}\b"
        if not re.search(pattern, source):
            missing.append(f"{page}: {file}::{name}")
    assert missing == []


def test_every_rule_has_a_standing_line() -> None:
    """The rule page's table lists MEM-1 to MEM-16."""
    table = (DOCS / "rules.md").read_text(encoding="utf-8")
    for n in range(1, 17):
        assert re.search(rf"^\| MEM-{n} ", table, flags=re.MULTILINE), f"MEM-{n} is missing"


def test_every_cli_command_is_in_the_guide() -> None:
    """Each top-level command appears in the CLI guide's table."""
    guide = (DOCS / "cli.md").read_text(encoding="utf-8")
    for name in cli.commands:
        assert f"`{name}" in guide, f"{name} is not in docs/cli.md"


def test_the_cli_reference_is_current() -> None:
    """docs/reference/cli.md is what ``python -m tests._cli_reference`` makes now."""
    written = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert written == cli_reference(), "run: python -m tests._cli_reference > docs/reference/cli.md"


# ------------------------------------------------------------ architecture


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports: every import statement, lazy ones
    too, but those only for type checking."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if _exists(sub) else target)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.startswith("flowdrop_local.") and name != module}


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layers() -> list[tuple[str, list[str]]]:
    """(layer, modules) from the table, top first. A module is in the layer that
    names it or, failing that, its nearest package's (``sync.schema`` beside ``sync``)."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| (.+?) \| .+ \|$", text, flags=re.MULTILINE)
    layers = []
    for layer, cell in rows:
        if layer == "layer":
            continue
        named = re.findall(r"`([\w.]+)`", cell)
        layers.append((layer, [f"flowdrop_local.{m}" for m in named]))
    return layers


def test_the_layer_table_matches_the_imports() -> None:
    """Every module is in one layer (its own, or its package's), and imports only
    from its layer or one below."""
    layers = _layers()
    assert [layer for layer, _ in layers][:2] == ["faces", "replication"]
    modules = {_module(path): path for path in (ROOT / "flowdrop_local").rglob("*.py")}

    def level(module: str) -> int:
        best: tuple[int, int] | None = None  # (length of the name matched, level)
        for at, (_, named) in enumerate(layers):
            for name in named:
                within = module == name or module.startswith(name + ".")
                if within and (best is None or len(name) > best[0]):
                    best = (len(name), at)
        assert best is not None, f"{module} is in no layer of docs/architecture.md"
        return best[1]

    up = []
    for module, path in sorted(modules.items()):
        if module == "flowdrop_local":
            continue  # the package root re-exports the public names of every layer
        here = level(module)
        for imported in sorted(_imports(path)):
            if imported != "flowdrop_local" and level(imported) < here:
                there = layers[level(imported)][0]
                up.append(f"{module} ({layers[here][0]}) -> {imported} ({there})")
    assert up == []
