"""The stream check: SSE framing or not, and tokens counted per event, not per read."""

from __future__ import annotations

from gateway.sse import SSEScanner

EVENT = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'


def test_events_are_counted_however_the_bytes_are_cut() -> None:
    stream = EVENT * 5 + b"data: [DONE]\n\n"
    for cut in (1, 3, 7, len(stream)):
        s = SSEScanner()
        for i in range(0, len(stream), cut):
            assert s.feed(stream[i : i + cut])
        assert s.finish() and s.tokens == 5 and s.data_events == 5


def test_the_usage_chunk_is_the_count_when_there_is_one() -> None:
    s = SSEScanner()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":42}}\n\n'
    assert s.feed(EVENT * 2 + usage + b"data: [DONE]\n\n")
    assert s.finish() and s.tokens == 42


def test_comments_and_other_fields_are_framing() -> None:
    s = SSEScanner()
    assert s.feed(b": keep-alive\r\n\r\nevent: message\nid: 1\nretry: 10\n" + EVENT)
    assert s.finish()


def test_anything_else_is_not() -> None:
    for bad in (b"\x00not json{{{", b'{"choices": []}\n', b"HTTP/1.1 200 OK\r\n\r\n"):
        s = SSEScanner()
        s.feed(bad + b"\n")
        assert not s.finish(), bad


def test_a_stream_without_events_or_cut_mid_line_is_not_complete() -> None:
    assert not SSEScanner().finish()
    s = SSEScanner()
    s.feed(EVENT + b"data: {half")
    assert not s.finish()


def test_an_endless_line_is_refused() -> None:
    s = SSEScanner(max_line=1024)
    assert not s.feed(b"data: " + b"x" * 2048)
