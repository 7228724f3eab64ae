"""Pieces that need no server: the event-stream decoder, times, outputs."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

import pytest

from cella._sse import KEEPALIVE, LineSplitter, SSEDecoder, SSEEvent, output_bytes
from cella.models import Execution, Output, parse_time


def decode(chunks):
    lines, dec, out = LineSplitter(), SSEDecoder(), []
    for chunk in chunks:
        for line in lines.feed(chunk):
            ev = dec.feed(line)
            if ev is not None:
                out.append(ev)
    for line in lines.flush():
        ev = dec.feed(line)
        if ev is not None:
            out.append(ev)
    last = dec.flush()
    if last is not None:
        out.append(last)
    return out


def test_sse_split_anywhere() -> None:
    stream = b'event: stdout\ndata: "a\\n"\n\n:\n\nevent: exit\r\ndata: {"exit_code":0}\r\n\r\n'
    whole = decode([stream])
    bytewise = decode([stream[i:i + 1] for i in range(len(stream))])
    assert whole == bytewise
    assert whole[0] == SSEEvent("stdout", '"a\\n"') and whole[1] is KEEPALIVE
    assert whole[2].event == "exit" and whole[2].json() == {"exit_code": 0}


def test_sse_multiline_data_and_unterminated_end() -> None:
    evs = decode([b"data: one\ndata: two\n\nevent: x\ndata: tail"])
    assert evs == [SSEEvent("message", "one\ntwo"), SSEEvent("x", "tail")]


def test_output_bytes() -> None:
    assert output_bytes("héllo") == "héllo".encode()
    assert output_bytes({"b64": base64.b64encode(b"\xff\x00").decode()}) == b"\xff\x00"


def test_parse_time() -> None:
    assert parse_time("2026-11-29T08:00:00.123Z") == datetime(2026, 11, 29, 8, 0, 0, 123000, tzinfo=timezone.utc)
    assert parse_time("2026-11-29T08:00:00Z").tzinfo == timezone.utc
    assert parse_time("2026-11-29T10:00:00+02:00") == datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)
    assert parse_time("2026-11-29T08:00:00.5-01:30").utcoffset() == -timedelta(hours=1, minutes=30)
    assert parse_time(None) is None
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_outputs() -> None:
    png = b"\x89PNG\r\n\x1a\nxx"
    ex = Execution.from_dict({"ok": True, "outputs": [
        {"mime": "image/png", "data": base64.b64encode(png).decode()},
        {"mime": "text/html", "data": "<b>x</b>"},
    ]})
    assert ex.png == png and ex.html == "<b>x</b>" and ex.json is None and ex.svg is None
    assert Output("text/html", "é").bytes == "é".encode() and Output("image/png", "").is_binary
