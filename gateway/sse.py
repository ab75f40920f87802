"""Checking a backend's server-sent events as they are relayed, and counting tokens.

An OpenAI-compatible stream is lines of `data:` (and possibly `event:`, `id:`,
`retry:` or `:` comments), events separated by blank lines. Anything else is not a
stream the client's SDK can read, so the gateway calls it a failure of the backend
rather than relaying it as a success.
"""

from __future__ import annotations

import re

_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def _may_be_field(partial: bytes) -> bool:
    """Can a line that starts with `partial` still be SSE framing?"""
    head = partial[:7]
    return head in (b"", b"\r") or any(head.startswith(f) or f.startswith(head) for f in _FIELDS)


class SSEScanner:
    """Fed the stream's bytes chunk by chunk; says whether they are SSE framing and
    counts the data events (without `[DONE]`) and the usage a backend reported."""

    __slots__ = ("_partial", "data_events", "max_line", "usage_tokens", "valid")

    def __init__(self, max_line: int = 16 * 1024 * 1024) -> None:
        self._partial = b""
        self.data_events = 0
        self.usage_tokens: int | None = None
        self.valid = True
        self.max_line = max_line

    def feed(self, chunk: bytes) -> bool:
        """Scan `chunk`; False once anything seen is not SSE framing."""
        if not self.valid:
            return False
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.max_line or not _may_be_field(self._partial):
            # A line that cannot become SSE fails now, not when (if ever) it ends:
            # a JSON body has no newline at all.
            self.valid = False
            return False
        for line in lines:
            if not line or line == b"\r":
                continue
            if not line.startswith(_FIELDS):
                self.valid = False
                return False
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue
                self.data_events += 1
                if b'"usage"' in payload:
                    found = _COMPLETION_TOKENS.search(payload)
                    if found:
                        self.usage_tokens = int(found.group(1))
        return True

    def finish(self) -> bool:
        """At the end of the stream: True when it ended on a line boundary after at
        least one data event."""
        if self._partial.strip():
            self.valid = False
        return self.valid and self.data_events > 0

    @property
    def tokens(self) -> int:
        """The backend's own count when it sent usage, else one per data event."""
        return self.usage_tokens if self.usage_tokens is not None else self.data_events
