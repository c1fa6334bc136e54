"""The order a merge gives a buffer: each side's links read, the ones it lacks made
from its own order, the deleted ancestors between them walked up until the lines of
every message meet, and the tree read (:mod:`..rules.order`); afterwards, the links
of what the merge made, and every link on both sides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ..plans import Plan, Run
from ..rules.merge import Entry
from ..rules.order import (
    ROOT,
    Link,
    answered_link,
    combine,
    link_new,
    parents_of_new,
    tops,
    tree_order,
)
from .side import Side

MAX_GROWN_CLIMB = 32
"""How many deleted ancestors a merge of what two sides appended walks up from the
new rows to the old last row before it merges the buffer whole instead."""


@attrs.define
class Ordering:
    """The merged order of both sides' rows, and the links it came from."""

    order: list[str]
    links: dict[str, Link]  # every link read, walked or made
    held: dict[str, dict[str, Link]]  # each side's own, as read


def shared_order(
    sides: Sequence[Side], before: Mapping[str, Sequence[Entry]], anchor: str | None
) -> Ordering | None:
    """The order of every row of ``before`` (each side's rows, in position order).

    ``anchor``: a merge of what both sides appended after the same rows (the last of
    them; ``before`` then starts some rows earlier): those rows stay as they are, and
    the new ones are read as the anchor's descendants. None when some new row is not
    one (a third replica placed it earlier): the caller merges the buffer whole.
    """
    every = list(dict.fromkeys(e.id for rows in before.values() for e in rows))
    held = {side.label: side.links(every) for side in sides}
    links = combine(*held.values())
    context = [] if anchor is None else every[: every.index(anchor) + 1]
    if anchor is not None and anchor not in links:
        return None  # both held it before either linked a message (synced before links)
    for side in sides:
        own = [e.id for e in before[side.label]]
        after = ROOT
        if anchor is not None:
            own = own[own.index(anchor) + 1 :]
            after = anchor
        mine = held[side.label]
        ranks = _ranks((side,), parents_of_new(own, links, after))
        link_new(own, links, mine.values(), ranks, after)
    if anchor is None:
        _climb(sides, every, links, held)
        return Ordering(tree_order(every, links), links, held)
    fixed = set(context)
    new = [i for i in every if i not in fixed]
    walked = _climb_to(sides, new, anchor, links, held)
    if walked is None:
        return None
    below = {i: links[i] for i in (*new, *walked)}
    below[anchor] = (ROOT, 0)  # the one top: below it, the anchor's subtree
    return Ordering(context + tree_order(new, below), links, held)


def _ranks(sides: Sequence[Side], parents: set[str]) -> dict[str, int]:
    """The highest rank among each parent's children on either side."""
    ranks: dict[str, int] = {}
    for side in sides:
        for parent, rank in side.link_ranks(sorted(parents)).items() if parents else ():
            ranks[parent] = max(ranks.get(parent, -1), rank)
    return ranks


def _fetch(
    sides: Sequence[Side], ids: list[str], held: dict[str, dict[str, Link]]
) -> dict[str, Link]:
    """The links of these (deleted) messages either side holds."""
    found = []
    for side in sides:
        got = side.links(ids)
        held[side.label].update(got)
        found.append(got)
    return combine(*found)


def _climb(
    sides: Sequence[Side], ids: list[str], links: dict[str, Link], held: dict[str, dict[str, Link]]
) -> None:
    """Read deleted ancestors into ``links`` until the lines up from ``ids`` all meet
    (or reach the root): the order of ``ids`` does not depend on what is above where
    they meet, so a buffer that lost its first million messages to a window is not
    walked back to its start."""
    group: dict[str, str] = {}

    def find(x: str) -> str:
        while group.get(x, x) != x:
            group[x] = group.get(group[x], group[x])  # halve the path
            x = group[x]
        return x

    def union(x: str, y: str) -> None:
        group[find(x)] = find(y)

    for id_ in ids:
        parent = links[id_][0]
        if parent == ROOT or parent in links:
            union(id_, parent)
    climbing = tops(ids, links)
    while climbing and len({find(i) for i in ids}) > 1:
        fetched = _fetch(sides, sorted({links[c][0] for c in climbing}), held)
        links.update(fetched)
        for node in climbing:
            parent = links[node][0]
            union(node, parent if parent in links else ROOT)  # unknown: from the root
        going = []
        for node, (parent, _) in fetched.items():
            if parent == ROOT or parent in links:
                union(node, parent)
            else:
                going.append(node)  # its line goes on up
        climbing = sorted(going)


def _climb_to(
    sides: Sequence[Side],
    new: list[str],
    anchor: str,
    links: dict[str, Link],
    held: dict[str, dict[str, Link]],
) -> list[str] | None:
    """The deleted messages between ``new`` and ``anchor`` (read into ``links``), or
    None unless every one of ``new`` descends from ``anchor`` through new rows and
    at most :data:`MAX_GROWN_CLIMB` deleted ones."""
    inside = {*new, anchor}
    walked: list[str] = []
    climbing = sorted({links[i][0] for i in new} - inside)
    for _ in range(MAX_GROWN_CLIMB + 1):
        if not climbing:
            return walked
        if ROOT in climbing or any(c in links for c in climbing):
            return None  # the root, or a row read (an older one): not below the anchor
        fetched = _fetch(sides, climbing, held)
        if len(fetched) != len(climbing):
            return None
        links.update(fetched)
        walked += climbing
        inside |= set(climbing)
        climbing = sorted({fetched[c][0] for c in climbing} - inside)
    return None


def record_links(
    sides: Sequence[Side],
    final: Sequence[Entry],
    ordering: Ordering,
    *,
    whole: bool,
    answered: Mapping[str, str],
) -> None:
    """Give what the merge made its links: a row answering a call in its tool run
    (``answered``: its id -> the turn declaring the call) the one every merge making
    it gives it; healed rows theirs from the merged order. Then write on each side
    every link it lacks or holds otherwise, and the links of the ancestors those
    name that it lacks (a deleted message's, say): a store holding a link holds its
    ancestors', so it never reads a message as hanging from the root for want of
    its parent's. ``whole``: ``final`` is the whole buffer (else it starts at a row
    both sides held)."""
    links = ordering.links
    for id_, turn in answered.items():
        links.setdefault(id_, answered_link(turn))
    order = [e.id for e in final]
    after = ROOT
    if not whole:  # from the first row with a link (older unlinked ones wait for a whole merge)
        first = next((k for k, id_ in enumerate(order) if id_ in links), len(order))
        after, order = (order[first], order[first + 1 :]) if order[first:] else (ROOT, [])
    ranks = _ranks(sides, parents_of_new(order, links, after))
    link_new(order, links, links.values(), ranks, after)
    for side in sides:
        own = ordering.held[side.label]
        rows = {i: link for i, link in links.items() if own.get(i) != link}
        have = set(own) | set(rows)
        wanted = {link[0] for link in rows.values()} - have - {ROOT}
        while wanted:
            have |= side.links(sorted(wanted)).keys()
            missing = sorted(wanted - have)
            if not missing:
                break
            found = _fetch(sides, missing, ordering.held)
            rows.update({i: found[i] for i in missing if i in found})
            have |= found.keys()
            wanted = {found[i][0] for i in missing if i in found} - have - {ROOT}
        if rows:
            side.tx.many("sync_link_put", [(i, *link) for i, link in rows.items()])


def link_store() -> Plan:
    """Give every message of the store that has no link one, from the store's order
    (as a merge of each buffer would): one statement (``sync_link_everything``)."""
    yield Run("sync_link_everything", ())
