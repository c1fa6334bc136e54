"""Deprecated: the transcript model moved to :mod:`flowdrop_local.transcript` (pure
functions of messages, below the handles that draw with them). This alias goes in
the next release."""

from .._deprecated import renamed
from ..transcript import buffer_html, message_text, transcript, transcript_html

__all__ = ["buffer_html", "message_text", "transcript", "transcript_html"]

renamed("flowdrop_local.viewer.transcript moved to flowdrop_local.transcript", stacklevel=2)
