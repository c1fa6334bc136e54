"""The local read-only viewer (``flowdrop-local serve``) and notebook transcripts."""

from ..transcript import transcript, transcript_html
from .server import serve

__all__ = ["serve", "transcript", "transcript_html"]
