"""The local read-only viewer (``flowdrop-local serve``) and notebook transcripts."""

from .server import serve
from .transcript import transcript, transcript_html

__all__ = ["serve", "transcript", "transcript_html"]
