"""Pure rules over messages: no SQL, no I/O.

``pairing`` holds the one reader of a declared call's id (MEM-11) and the
placeholder a healed call gets (MEM-3); ``incoming`` validates and normalises a
message at the edge before any write starts; ``order`` is the one order every
replica gives a buffer's messages, and ``merge`` the rules a sync's merge applies
along it.
"""
