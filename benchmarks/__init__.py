"""Benchmarks for flowdrop_local, side by side with raw sqlite3 and the peer libraries.

Scripts, not tests: they print numbers and write ``benchmarks/RESULTS.md``; nothing
asserts on timing.

* ``python -m benchmarks [--quick]``: the workloads of issue 4 (append, healing
  append, read the last 50, cold open + read, batch import) at several history
  lengths, every system interleaved round by round (:mod:`benchmarks.run`).
* ``python -m benchmarks --postgresql [--quick]``: the same workloads on one
  PostgreSQL server (raw psycopg, flowdrop_local, the peers' PostgreSQL stores),
  8 threads on 8 buffers vs on one, and where an append's round trips and
  statements spend their time (:mod:`benchmarks.postgresql`,
  :mod:`benchmarks.pg_hotspots`).
* ``python -m benchmarks.keys``: position-key length under stress, through the
  public API (:mod:`benchmarks.keys`).
* ``python -m benchmarks.hotspots``: cProfile of flowdrop_local's append and
  healing paths, top functions (:mod:`benchmarks.hotspots`).

Install the peers with ``pip install -e '.[bench]'``.
"""
