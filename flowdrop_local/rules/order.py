"""The one order every replica gives a buffer's messages (offline sync): pure, no I/O.

Each message a sync has seen carries a **link**: the message it was written after
(``ROOT``, ``''``: none, it came first) and a **rank**. A buffer's links form a tree,
and its order is that tree read depth first, a message's children taken by higher
rank, then lower id. Links never change once made and travel with their messages
(and with their deleted ancestors), so any two replicas order the messages they
share alike, for ever, whatever order syncs run in: a sequence CRDT (RGA).

A link is made the first time a sync sees a message, from that store's order at the
time (:func:`link_new`): after the message before it, ranked above every child that
message already has, so it reads right after it, as it did on that store (a
placeholder healed into a tool run stays in the run). Two blocks appended after the
same message on two replicas are both rank 0 there: each stays one contiguous
block, the one whose first message has the lower id first (UUIDv7: the one
started earlier).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Final

ROOT: Final = ""
"""The ``after`` of a message that came first in its buffer."""

Link = tuple[str, int]
"""(after, rank): the message written before this one (``ROOT``: none) and its rank."""

MAX_RANK: Final = 2**31
"""The highest rank: a new child's rank is one above its siblings' but never above
this (a peer's file could otherwise push every later rank past what a store
takes). The row a merge makes to answer a call in its tool run takes it (see
:func:`answered_link`)."""


def winner(x: Link, y: Link) -> Link:
    """Of two links one message was given apart (two stores that held it before either
    linked it: an import on both, say), the one every replica keeps: the lower rank,
    then the lower ``after``. Deterministic, so replicas settle on one."""
    return min(x, y, key=lambda link: (link[1], link[0]))


def combine(*found: Mapping[str, Link]) -> dict[str, Link]:
    """The links several stores hold, one per message (:func:`winner` where they differ)."""
    links: dict[str, Link] = {}
    for side in found:
        for id_, link in side.items():
            links[id_] = winner(links[id_], link) if id_ in links else link
    return links


def link_new(
    order: Sequence[str],
    links: MutableMapping[str, Link],
    known: Iterable[Link],
    ranks_after: Mapping[str, int],
    after: str = ROOT,
) -> dict[str, Link]:
    """Links for the messages of ``order`` (one store's order of a buffer) that have
    none in ``links``, each after the message before it in ``order``; added to
    ``links`` and returned.

    A new child ranks one above the children its parent has on that store (``known``:
    the links of what it read; ``ranks_after``: for a parent, the highest rank among
    its children the store holds, read or not: deleted ones whose descendants stand
    later), so it reads first among them, right after its parent, as it did there.
    What another store holds is left out: a block both appended after the same
    message is rank 0 on each, and the two stand by their first ids. A message linked
    by this call has no child yet: its first new child ranks 0 (an append at the end).
    ``after``: the message before ``order[0]`` (``ROOT``: none; a merge of what two
    sides appended reads from a later row).
    """
    made: dict[str, Link] = {}
    top: dict[str, int] = {}  # the highest rank among each parent's known children
    for parent, rank in known:
        top[parent] = max(top.get(parent, -1), rank)
    previous = after
    for id_ in order:
        if id_ not in links:
            rank = min(max(top.get(previous, -1), ranks_after.get(previous, -1)) + 1, MAX_RANK)
            links[id_] = made[id_] = (previous, rank)
            top[previous] = rank
        previous = id_
    return made


def tree_order(ids: Iterable[str], links: Mapping[str, Link]) -> list[str]:
    """``ids`` (each with a link in ``links``) in the tree's order.

    ``links`` may hold more than ``ids``: deleted messages (they keep their place,
    so their children keep theirs) and ancestors above where every id's line meets
    (:func:`..sync.order` reads no further up; the order below does not depend on
    what is above). A link whose ``after`` is not in ``links`` (a store that never
    held it, a damaged or hostile file) hangs from the root. Links that form a cycle
    (only a hostile file makes one) are read after the rest, from the lowest id.
    """
    wanted = set(ids)
    children: dict[str, list[str]] = {}
    for id_, (after, _) in links.items():
        parent = after if after in links and after != id_ else ROOT
        children.setdefault(parent, []).append(id_)
    for kids in children.values():
        kids.sort(key=lambda i: (-links[i][1], i))
    seen: set[str] = set()
    found: list[str] = []

    def walk(start: str) -> None:
        stack = [start]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node in wanted:
                found.append(node)
            stack.extend(reversed(children.get(node, ())))

    for top in children.get(ROOT, ()):
        walk(top)
    for rest in sorted(set(links) - seen):  # a cycle: nothing above it reaches the root
        walk(rest)
    missing = wanted - seen
    if missing:
        raise ValueError(f"{len(missing)} message(s) without a link, e.g. {min(missing)}")
    return found


def answered_link(turn: str) -> Link:
    """The link of the row a merge makes to answer a call in its tool run (its id
    derived from the result's, so two merges apart may make the same row): right
    after the turn declaring the call, first among its children, whichever merge
    made it, so every replica links it alike."""
    return (turn, MAX_RANK)


def parents_of_new(order: Sequence[str], links: Mapping[str, Link], after: str = ROOT) -> set[str]:
    """The messages :func:`link_new` would link a first new child to: the caller
    reads the ranks of their children (``ranks_after``) from every store here."""
    parents = set()
    previous = after
    for id_ in order:
        if id_ not in links and (previous in (ROOT, after) or previous in links):
            parents.add(previous)
        previous = id_
    return parents


def tops(ids: Iterable[str], links: Mapping[str, Link]) -> list[str]:
    """Those of ``ids`` whose parent is not among ``links`` (nor the root): where a
    walk up through deleted ancestors starts."""
    return sorted(i for i in ids if links[i][0] != ROOT and links[i][0] not in links)
