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


def load(family: str) -> type[System]:
    """The :class:`System` class of ``family``.

    Raises:
        ImportError: the library is not installed (``pip install -e '.[bench]'``).
    """
    module, cls = FAMILIES[family]
    loaded: type[System] = getattr(importlib.import_module(f".{module}", __name__), cls)
    return loaded


def select(names: list[str]) -> tuple[list[System], dict[str, str]]:
    """Instances for ``names`` (families, or ``family-durability``), and the ones that failed.

    Returns:
        The systems in a stable order, and ``{name: why it is missing}``.
    """
    systems: list[System] = []
    missing: dict[str, str] = {}
    for name in names:
        family, _, durability = name.partition("-")
        if family not in FAMILIES:
            raise ValueError(f"unknown system {name!r}; choose from {', '.join(FAMILIES)}")
        try:
            cls = load(family)
        except ImportError as error:
            missing[name] = f"not installed ({error}); pip install -e '.[bench]'"
            continue
        if durability and durability not in cls.durabilities:
            raise ValueError(f"{family} runs only at {', '.join(cls.durabilities)}")
        for each in [durability] if durability else list(cls.durabilities):
            systems.append(cls(each))
    return systems, missing
