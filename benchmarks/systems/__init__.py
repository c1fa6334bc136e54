"""The benchmarked systems, imported lazily so a missing peer skips only itself."""

from __future__ import annotations

import importlib

from ..core import System

# family -> (module, class)
FAMILIES: dict[str, tuple[str, str]] = {
    "flowdrop": ("flowdrop", "Flowdrop"),
    "raw": ("raw", "RawSqlite"),
    "agents": ("agents_sdk", "AgentsSession"),
    "langchain": ("langchain_sql", "LangchainHistory"),
    "langgraph": ("langgraph_saver", "LanggraphSaver"),
}
# The same families on PostgreSQL (``python -m benchmarks --postgresql``).
PG_FAMILIES: dict[str, tuple[str, str]] = {
    "flowdrop": ("pg_flowdrop", "PgFlowdrop"),
    "raw": ("pg_raw", "RawPsycopg"),
    "agents": ("pg_agents", "PgAgentsSession"),
    "langchain": ("pg_langchain", "PgLangchainHistory"),
    "langgraph": ("pg_langgraph", "PgLanggraphSaver"),
}


def load(family: str, families: dict[str, tuple[str, str]] = FAMILIES) -> type[System]:
    """The :class:`System` class of ``family``.

    Raises:
        ImportError: the library is not installed (``pip install -e '.[bench]'``).
    """
    module, cls = families[family]
    loaded: type[System] = getattr(importlib.import_module(f".{module}", __name__), cls)
    return loaded


def select(
    names: list[str], families: dict[str, tuple[str, str]] = FAMILIES
) -> tuple[list[System], dict[str, str]]:
    """Instances for ``names`` (families, or ``family-durability``), and the ones that failed.

    ``families``: :data:`FAMILIES` (SQLite) or :data:`PG_FAMILIES`.

    Returns:
        The systems in a stable order, and ``{name: why it is missing}``.
    """
    systems: list[System] = []
    missing: dict[str, str] = {}
    for name in names:
        family, _, durability = name.partition("-")
        if family not in families:
            raise ValueError(f"unknown system {name!r}; choose from {', '.join(families)}")
        try:
            cls = load(family, families)
        except ImportError as error:
            missing[name] = f"not installed ({error}); pip install -e '.[bench]'"
            continue
        if durability and durability not in cls.durabilities:
            raise ValueError(f"{family} runs only at {', '.join(cls.durabilities)}")
        for each in [durability] if durability else list(cls.durabilities):
            systems.append(cls(each))
    return systems, missing
