"""Pure rules over messages: no SQL, no I/O.

``pairing`` holds the one reader of a declared call's id (MEM-11) and the
placeholder a healed call gets (MEM-3); ``incoming`` validates and normalises a
message at the edge before any write starts; ``order`` is the one order every
replica gives a buffer's messages, and ``merge`` the rules a sync's merge applies
along it.

The public rule functions an application may call on its own lists of messages
(MEM-4 assembly, MEM-5 normalisation, MEM-11's call id reader, MEM-16 text to
message, and the placeholder's text) are exported here.
"""

from .assemble import assemble
from .normalize import normalize, validate_pairing
from .pairing import PLACEHOLDER_CONTENT, call_id_of
from .text import text_to_message

__all__ = [
    "PLACEHOLDER_CONTENT",
    "assemble",
    "call_id_of",
    "normalize",
    "text_to_message",
    "validate_pairing",
]
