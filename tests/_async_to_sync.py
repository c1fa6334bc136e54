"""Make the blocking PostgreSQL I/O from its async source, as psycopg 3 makes its own.

``python -m tests._async_to_sync`` rewrites ``flowdrop_local/backends/postgresql_io.py``
from ``postgresql_io_async.py``; ``tests/test_async_to_sync.py`` fails when the file
is not what this makes. The transformation is on the syntax tree, so it cannot
miss an ``await`` in a string or rename half a word:

* ``async def``, ``async with``, ``async for`` (comprehensions too) lose their ``async``;
  ``await x`` is ``x``;
* the names in :data:`BLOCKING` are replaced (``AsyncConnection`` -> ``Connection``,
  ``AsyncPgTx`` -> ``PgTx``...), in names, attributes and imports;
* ``asyncio.shield(x)`` is ``x`` (a blocking call cannot be cancelled half-way),
  and ``import asyncio`` goes when nothing uses it.

Comments do not survive (the source is the file to read); docstrings do, and the
module's docstring says where the file comes from.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "flowdrop_local" / "backends" / "postgresql_io_async.py"
TARGET = ROOT / "flowdrop_local" / "backends" / "postgresql_io.py"

BLOCKING = {
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncIterator": "Iterator",
    "AsyncPgTx": "PgTx",
    "AsyncTx": "Tx",
    "asynccontextmanager": "contextmanager",
}

HEADER = (
    "PostgreSQL I/O, blocking: generated from postgresql_io_async.py, do not edit.\n\n"
    "``python -m tests._async_to_sync`` writes this file again; read (and change) the\n"
    "async source, whose docstring says what is here.\n"
)


class _Blocking(ast.NodeTransformer):
    """The blocking form of each async construct, and the blocking names."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.FunctionDef:
        self.generic_visit(node)
        fields = {name: getattr(node, name) for name in node._fields}
        return ast.copy_location(ast.FunctionDef(**fields), node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.With:
        self.generic_visit(node)
        fields = {name: getattr(node, name) for name in node._fields}
        return ast.copy_location(ast.With(**fields), node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.For:
        self.generic_visit(node)
        fields = {name: getattr(node, name) for name in node._fields}
        return ast.copy_location(ast.For(**fields), node)

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.is_async = 0  # [x async for x in xs] -> [x for x in xs]
        return node

    def visit_Await(self, node: ast.Await) -> ast.expr:
        return self.visit(node.value)  # type: ignore[no-any-return]

    def visit_Call(self, node: ast.Call) -> ast.expr:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "shield"
            and isinstance(func.value, ast.Name)
            and func.value.id == "asyncio"
        ):
            return self.visit(node.args[0])  # type: ignore[no-any-return]
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = BLOCKING.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        self.generic_visit(node)
        node.attr = BLOCKING.get(node.attr, node.attr)
        return node

    def visit_alias(self, node: ast.alias) -> ast.alias:
        node.name = BLOCKING.get(node.name, node.name)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        node.name = BLOCKING.get(node.name, node.name)
        self.generic_visit(node)
        return node


def _uses(tree: ast.Module, name: str) -> bool:
    return any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(tree))


def blocking_tree(source: str) -> ast.Module:
    """The blocking module's syntax tree, made from the async source's."""
    tree = _Blocking().visit(ast.parse(source))
    assert isinstance(tree, ast.Module)
    body = tree.body
    first = body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    first.value.value = HEADER
    if not _uses(tree, "asyncio"):
        body[:] = [
            statement
            for statement in body
            if not (
                isinstance(statement, ast.Import)
                and [alias.name for alias in statement.names] == ["asyncio"]
            )
        ]
    return ast.fix_missing_locations(tree)


def comparable(tree: ast.Module) -> str:
    """The tree as text, docstrings cleaned as a formatter leaves them."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                first.value.value = inspect.cleandoc(first.value.value)
    return ast.dump(tree)


def main() -> None:
    text = ast.unparse(blocking_tree(SOURCE.read_text(encoding="utf-8"))) + "\n"
    TARGET.write_text(text, encoding="utf-8")
    # ruff formats it as the rest of the package (the tree stays the same).
    subprocess.run([sys.executable, "-m", "ruff", "format", "-q", str(TARGET)], check=True)
    subprocess.run(
        [sys.executable, "-m", "ruff", "check", "-q", "--fix", "--select", "I", str(TARGET)],
        check=True,
    )


if __name__ == "__main__":
    main()
