"""capture.record.Headers: encoded once, extended cheaply, always the same
bytes as encoding the plain list."""

from __future__ import annotations

import pytest

from bridge.capture.record import Headers, encode_headers

BASE = [("conn_id", b"c1"), ("proto", b"4"), ("origin", b"client")]


@pytest.mark.parametrize("extra", [[("ack_ref", b"0:12")], [("granted", b"0102")],
                                   [("dup", b"1"), ("alias_topic", b"a/b")], []])
def test_headers_encode_as_the_plain_list(extra):
    h = Headers(BASE)
    assert encode_headers(h) == encode_headers(list(BASE))
    more = h.plus(extra)
    assert list(more) == BASE + extra
    assert encode_headers(more) == encode_headers(BASE + extra)


def test_unknown_keys_are_refused_on_the_fast_path_too():
    with pytest.raises(ValueError, match="unknown capture header key 'nope'"):
        encode_headers(Headers(BASE).plus([("nope", b"x")]))
