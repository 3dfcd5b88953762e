"""proton's reactor with one defect of python-qpid-proton 0.40 mended.

When a socket fails and its timer expires in the same round, proton's
``IOHandler.on_selectable_error`` unbinds the transport and then
``on_selectable_expired`` calls ``transport.capacity()`` on ``None``. The
AttributeError leaves ``Container.process()``, so the reactor thread stops:
a forwarder would fail every later batch with "internal error", and the
test peers stopped answering (a CI run saw it when a proxy dropped a
connection). ``container()`` builds a Container whose global handler skips
an expiry of a selectable that no longer has a transport: there is nothing
left to tick, and the error path has already closed it.
"""

from __future__ import annotations

from typing import Any

from proton._handlers import IOHandler
from proton.reactor import Container


class SafeIOHandler(IOHandler):
    """IOHandler that ignores the expiry of a selectable whose transport is gone."""

    def on_selectable_expired(self, event: Any) -> None:
        if getattr(event.selectable, "_transport", None) is None:
            return
        super().on_selectable_expired(event)


def container(*handlers: Any, **kwargs: Any) -> Container:
    """``proton.reactor.Container(*handlers, **kwargs)`` with :class:`SafeIOHandler`."""
    kwargs.setdefault("global_handler", SafeIOHandler())
    return Container(*handlers, **kwargs)
