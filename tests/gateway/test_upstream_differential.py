"""The upstream client's parser against h11, on generated responses.

h11 is a well-kept pure-Python HTTP/1.1 implementation, used here only as the
reference: for every generated response, cut into reads at generated points, both
must agree on the status, the headers, the body bytes, and whether the connection
may carry another request. Where the two differ by design (we refuse a response
with both Content-Length and Transfer-Encoding, which h11 reads as chunked), the
generator does not go; the conformance suite checks our verdict there.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.upstream import ResponseLimits, _Connection

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12).filter(
    lambda s: (
        s
        not in {"content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer"}
    )
)
VALUE = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ;=/.,", max_size=20
).map(str.strip)


@dataclass
class Verdict:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    reusable: bool
    error: bool


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    status = draw(st.sampled_from([200, 201, 202, 400, 404, 429, 500, 503]))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    headers = draw(st.lists(st.tuples(TOKEN, VALUE), max_size=6))
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    close = draw(st.booleans())
    interim = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n"]))
    lines = [b"HTTP/%s %d X" % (version, status)]
    lines += [f"{k}: {v}".encode() for k, v in headers]
    if close:
        lines.append(b"connection: close")
    payload = b""
    if framing == "length":
        lines.append(b"content-length: %d" % len(body))
        payload = body
    elif framing == "chunked" and version == b"1.1":
        lines.append(b"transfer-encoding: chunked")
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        ext = draw(st.sampled_from([b"", b";a=b", b";x"]))
        for p in pieces:
            if p:
                payload += b"%x%s\r\n%s\r\n" % (len(p), ext, p)
        trailer = draw(st.sampled_from([b"", b"x-trailer: t\r\n"]))
        payload += b"0\r\n" + trailer + b"\r\n"
    else:
        payload = body  # delimited by the end of the connection
    data = interim + b"\r\n".join(lines) + b"\r\n\r\n" + payload
    splits = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=6))))
    return data, splits


def pieces(data: bytes, splits: list[int]) -> list[bytes]:
    bounds = [0, *[s for s in splits if s < len(data)], len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def ours(data: bytes, splits: list[int]) -> Verdict:
    loop = asyncio.new_event_loop()
    try:
        c = _Connection(loop, ResponseLimits())
        body = b""
        for part in pieces(data, splits):
            c.data_received(part)
            while c.chunks:
                body += c.take()
        if not c.complete and c.error is None:
            c.connection_lost(None)  # the end of the connection
            while c.chunks:
                body += c.take()
        reusable = c.complete and c.keep_alive and c.error is None and not c.closed
        headers = [(k.lower(), v) for k, v in c.headers]
        return Verdict(c.status, headers, body, reusable, c.error is not None)
    finally:
        loop.close()


def reference(data: bytes, splits: list[int]) -> Verdict:
    c = h11.Connection(h11.CLIENT)
    c.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
    c.send(h11.EndOfMessage())
    status, headers, body, done, eof = 0, [], b"", False, False
    try:
        feed = [*pieces(data, splits), b""]
        while not done:
            event = c.next_event()
            if event is h11.NEED_DATA:
                if not feed:
                    break
                part = feed.pop(0)
                eof = not part
                c.receive_data(part)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = [(k, v) for k, v in event.headers]
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                done = True
    except h11.RemoteProtocolError:
        return Verdict(status, headers, body, False, True)
    reusable = c.their_state is h11.DONE and not eof  # not once the connection has ended
    return Verdict(status, headers, body, reusable, not done)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_same_verdict_and_bytes_as_h11(case: tuple[bytes, list[int]]) -> None:
    data, splits = case
    a, b = ours(data, splits), reference(data, splits)
    assert a.error == b.error, (data, a, b)
    if not a.error:
        assert (a.status, a.headers, a.body) == (b.status, b.headers, b.body), (data, a, b)
        assert a.reusable == b.reusable, (data, a, b)


@settings(max_examples=200, deadline=None)
@given(responses(), st.integers(0, 400), st.binary(min_size=1, max_size=3))
def test_corrupted_responses_never_pass_as_different_answers(
    case: tuple[bytes, list[int]], at: int, junk: bytes
) -> None:
    """Bytes overwritten somewhere: when both parsers accept, they read the same."""
    data, splits = case
    at = min(at, len(data) - 1)
    bad = data[:at] + junk + data[at + len(junk) :]
    a, b = ours(bad, splits), reference(bad, splits)
    if not a.error and not b.error:
        assert (a.status, a.body) == (b.status, b.body), (bad, a, b)
