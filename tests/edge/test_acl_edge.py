"""The ACL file applied by the edge's session (sans-IO) and by a running edge:
publishing [LG-acl-publish], subscribing [LG-acl-subscribe] and delivery."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, load_config
from bridge.edge.acl import AclFile
from bridge.edge.message import Message
from bridge.edge.server import EdgeServer
from bridge.mqtt import Subscribe, Subscription, encode
from tests.edge.test_session import connected
from tests.edge.util import publish

ACL = """\
topic read public/#
topic write in/#

user alice
topic readwrite site/alice/#
topic deny site/alice/secret
"""


def with_acl(level: int, **fields):
    h = connected(level, **fields)
    acl = AclFile.parse(ACL)
    h.session.router.acl = lambda: acl
    return h


@pytest.mark.parametrize("level", [4, 5])
def test_lg_acl_subscribe_refuses_per_filter(level):
    h = with_acl(level)
    h.feed(encode(Subscribe(2, [Subscription("public/#", 1), Subscription("private/#", 1),
                                Subscription("#", 0)]), level))
    refused = 0x87 if level == 5 else 0x80
    codes = h.take()[-3:]
    assert codes == bytes((1, refused, 0))  # '#' overlaps public/#: granted, filtered at delivery
    assert "[LG-acl-subscribe]" in h.notices[-1]
    assert [s.topic_filter for s in h.session.router.tree.subscriptions("dev")] == ["public/#", "#"]


def test_lg_acl_publish_mqtt5_is_refused_with_0x87_and_captured_marked():
    h = with_acl(5)
    h.feed(publish(5, topic="public/x", qos=1, packet_id=3))
    assert h.take() == b"\x40\x03\x00\x03\x87"
    hd = h.headers(-1)
    assert hd["reject"] == b"LG-acl-publish" and hd["reject_code"] == b"135"
    h.feed(publish(5, topic="in/x", qos=1, packet_id=4))
    assert h.take() == b"\x40\x02\x00\x04" and "reject" not in h.headers(-1)


@pytest.mark.parametrize("qos, ack", [(1, b"\x40\x02\x00\x05"), (2, b"\x50\x02\x00\x05")])
def test_lg_acl_publish_mqtt311_is_acknowledged_and_dropped(qos, ack):
    h = with_acl(4)
    h.feed(publish(4, topic="public/x", qos=qos, packet_id=5))
    assert h.take() == ack
    assert h.headers(-1)["reject"] == b"LG-acl-publish"
    if qos == 2:  # no Packet Identifier kept: the PUBREL still gets PUBCOMP
        h.feed(b"\x62\x02\x00\x05")
        assert h.take() == b"\x70\x02\x00\x05"


def test_lg_acl_read_is_checked_again_at_delivery():
    h = with_acl(4, username="alice")
    h.feed(encode(Subscribe(2, [Subscription("site/alice/#", 0)]), 4))
    assert h.take() == b"\x90\x03\x00\x02\x00"
    router = h.session.router
    for topic in ("site/alice/open", "site/alice/secret"):
        frame = publish(4, topic=topic, payload=b"p")
        router.route(Message.from_frame(frame, 4, origin="x", ready=True, ref=(0, 1)))
    h.perform(h.session.deliver(0.0))
    assert h.take() == publish(4, topic="site/alice/open", payload=b"p")  # the deny applies


def test_a_missing_acl_file_is_a_start_up_error(tmp_path):
    import asyncio
    cfg = load_config(None, [f"data_dir={tmp_path}", "edge.port=0",
                             f"edge.acl_file={tmp_path / 'nope.acl'}"], env={})
    with pytest.raises(ConfigError, match=r"^config error: edge\.acl_file: .*nope\.acl"):
        asyncio.run(EdgeServer(cfg).start())
