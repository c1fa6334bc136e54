"""The blocking PostgreSQL I/O is generated from the async source, and is current.

One source (``backends/postgresql_io_async.py``) for both backends' transaction,
schema preparation, check and export; ``python -m tests._async_to_sync`` writes
the blocking twin. These tests fail when the twin was edited by hand, or the
source changed without it.
"""

from __future__ import annotations

import ast

from flowdrop_local.backends import postgresql_io, postgresql_io_async

from ._async_to_sync import SOURCE, TARGET, blocking_tree, comparable


def test_the_transform_makes_each_async_construct_blocking() -> None:
    """Every async form the source may use, on a small module of its own."""
    source = (
        '"""doc"""\n'
        "import asyncio\n"
        "async def f(pool: AsyncConnectionPool, xs: AsyncIterator[int]) -> list[int]:\n"
        "    async with pool.connection() as conn:\n"
        "        await asyncio.shield(conn.close())\n"
        "    async for x in xs:\n"
        "        pass\n"
        "    return [await g(x) async for x in xs]\n"
    )
    tree = blocking_tree(source)
    made = ast.unparse(ast.Module(body=tree.body[1:], type_ignores=[]))  # not the header
    assert "async" not in made.lower() and "await" not in made and "asyncio" not in made
    assert "def f(pool: ConnectionPool, xs: Iterator[int])" in made
    assert "conn.close()" in made and "[g(x) for x in xs]" in made


def test_the_blocking_io_is_what_the_generator_makes_of_the_async_source() -> None:
    made = comparable(blocking_tree(SOURCE.read_text(encoding="utf-8")))
    found = comparable(ast.parse(TARGET.read_text(encoding="utf-8")))
    assert found == made, (
        "flowdrop_local/backends/postgresql_io.py is not current: "
        "run python -m tests._async_to_sync (and edit the async source, not the twin)"
    )


def test_the_blocking_io_awaits_nothing_and_names_nothing_async() -> None:
    tree = ast.parse(TARGET.read_text(encoding="utf-8"))
    async_nodes = (ast.AsyncFunctionDef, ast.AsyncWith, ast.AsyncFor, ast.Await)
    assert not [type(node).__name__ for node in ast.walk(tree) if isinstance(node, async_nodes)]
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not {name for name in names if "async" in name.lower()}


def test_the_two_modules_offer_the_same_names_and_signatures() -> None:
    """Each public function and each transaction method has its twin, arguments alike."""
    import inspect

    def shape(module: object) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != getattr(module, "__name__", None):
                continue
            if inspect.isclass(value):
                for method, function in vars(value).items():
                    if inspect.isfunction(function):
                        key = f"{name.removeprefix('Async')}.{method}"
                        found[key] = list(inspect.signature(function).parameters)
            elif inspect.isfunction(value):
                found[name] = list(inspect.signature(value).parameters)
        return found

    blocking, source = shape(postgresql_io), shape(postgresql_io_async)
    assert "PgTx.open_buffer" in blocking and "prepare" in blocking and "check" in blocking
    assert blocking == source
