"""bridge.amqp.reactor: the expiry of a selectable whose transport proton's
error path already unbound does not stop the reactor thread."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from proton import Handler
from proton._handlers import IOHandler

from bridge.amqp.reactor import SafeIOHandler, container


def _expired_without_transport() -> SimpleNamespace:
    return SimpleNamespace(selectable=SimpleNamespace(_transport=None, _reactor=SimpleNamespace(now=1.0)))


def test_proton_io_handler_fails_on_an_expiry_after_the_error_path_unbound_the_transport():
    """The defect being mended (python-qpid-proton 0.40). If this fails, proton
    fixed it and bridge/amqp/reactor.py can go."""
    with pytest.raises(AttributeError, match="capacity"):
        IOHandler().on_selectable_expired(_expired_without_transport())


def test_safe_io_handler_skips_that_expiry():
    SafeIOHandler().on_selectable_expired(_expired_without_transport())


def test_safe_io_handler_still_ticks_a_live_transport():
    seen = []

    class T:
        closed = False

        def capacity(self):
            seen.append("capacity")
            return 0

        def pending(self):
            return 0

        def tick(self, now):
            seen.append(("tick", now))
            return 0

    class S:
        _transport = T()
        _reactor = SimpleNamespace(now=2.0)
        reading = writing = False
        deadline = None

        def update(self):
            seen.append("update")

    SafeIOHandler().on_selectable_expired(SimpleNamespace(selectable=S()))
    assert "capacity" in seen and ("tick", 2.0) in seen


def test_containers_are_built_with_the_safe_handler():
    c = container(Handler())
    assert isinstance(c.global_handler.base, SafeIOHandler)
