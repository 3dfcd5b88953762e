"""proton's reactor, with one defect of python-qpid-proton 0.40 mended and
a fast path for the forwarder's dispositions.

**The defect.** When a socket fails and its timer expires in the same
round, proton's ``IOHandler.on_selectable_error`` unbinds the transport and
then ``on_selectable_expired`` calls ``transport.capacity()`` on ``None``.
The AttributeError leaves ``Container.process()``, so the reactor thread
stops: a forwarder would fail every later batch with "internal error", and
the test peers stopped answering (a CI run saw it when a proxy dropped a
connection). :class:`SafeIOHandler` skips an expiry of a selectable that no
longer has a transport: there is nothing left to tick, and the error path
has already closed it.

**The fast path.** proton's Python binding wraps every event and every
delivery in Python objects (``Event.wrap``, ``Delivery``, attachments
records) and dispatches each event to two handlers: measured here, a bare
``MessagingHandler`` sender spends 60-66 us of CPU per message, nearly all
of it there, and reaches 8,000-12,700 msg/s against RabbitMQ on this
machine. The forwarder's transfers and their dispositions are the only
per-message events, so they go through proton's C API (``cproton_ffi``,
the binding's own cffi module) instead: :func:`send` makes, fills and
advances a delivery with three C calls, and :class:`FastContainer` hands a
``PN_DELIVERY`` event to a callback with the raw delivery before proton
wraps it; the callback settles what it recognises (an *accepted* outcome of
one of its deliveries) and returns True, or returns False and the event
goes the usual way (every other outcome: the engine's ``on_delivery`` reads
the outcome's condition through the wrappers). The same prototype sent
pre-encoded messages at 6-7 us of CPU each, 15,600-25,000 msg/s (RabbitMQ's
limit then). :meth:`FastContainer.process` is proton's own loop (identical
in python-qpid-proton 0.39 and 0.40, the versions pyproject allows) with
that one test added at its head (and without its debug log calls).

Deliveries kept across events are held with ``pn_incref`` (proton's own
reference count, what its wrappers do) and released with :func:`release`:
a pointer the engine holds stays valid even after proton freed the link.
"""

from __future__ import annotations

from typing import Any, Callable

from cproton_ffi import ffi, lib
from proton._events import Event
from proton._handlers import IOHandler
from proton.reactor import Container

__all__ = ["FastContainer", "SafeIOHandler", "container", "delivery_key", "release", "send"]

PN_DELIVERY = lib.PN_DELIVERY
PN_ACCEPTED = lib.PN_ACCEPTED
_NULL = ffi.NULL


class SafeIOHandler(IOHandler):
    """IOHandler that ignores the expiry of a selectable whose transport is gone."""

    def on_selectable_expired(self, event: Any) -> None:
        if getattr(event.selectable, "_transport", None) is None:
            return
        super().on_selectable_expired(event)


def delivery_key(d: Any) -> int:
    """The address of a raw ``pn_delivery_t *`` (a wrapper's ``_impl`` too):
    the engine's key for its deliveries in flight."""
    return int(ffi.cast("uintptr_t", d))


def send(link_impl: Any, tag: bytes, data: bytes) -> Any:
    """One whole message on the sender link ``link_impl`` (a ``pn_link_t *``,
    a proton ``Sender``'s ``_impl``): a new delivery tagged ``tag``, its
    bytes, advanced. Returns the delivery, held (``pn_incref``): give it
    back with :func:`release`."""
    d = lib.pn_delivery(link_impl, (len(tag), ffi.from_buffer(tag)))
    lib.pn_link_send(link_impl, ffi.from_buffer(data), len(data))
    lib.pn_link_advance(link_impl)
    lib.pn_incref(d)
    return d


def release(d: Any, settle: bool = False) -> None:
    """Let go of a delivery :func:`send` returned (settling it first: ``settle``)."""
    if settle:
        lib.pn_delivery_settle(d)
    lib.pn_decref(d)


class FastContainer(Container):
    """proton's Container whose loop first offers each ``PN_DELIVERY`` event,
    unwrapped, to ``fast_delivery(d) -> bool`` (True: handled, the event is
    consumed; False: dispatched as usual)."""

    fast_delivery: Callable[[Any], bool] | None = None

    def process(self) -> bool:  # proton 0.39/0.40 Reactor.process, plus the fast path at the head
        collector = self._collector
        col = collector._impl
        fast = self.fast_delivery
        peek, etype, edelivery, pop = (lib.pn_collector_peek, lib.pn_event_type, lib.pn_event_delivery,
                                       lib.pn_collector_pop)
        self.mark()
        previous: Any = lib.PN_EVENT_NONE
        while True:
            if self._yield:
                self._yield = False
                return True
            if fast is not None:
                impl = peek(col)
                if impl != _NULL and etype(impl) == PN_DELIVERY and fast(edelivery(impl)):
                    pop(col)
                    continue
            event = collector.peek()
            if event:
                type = event.type
                handler = event.handler or self._handler
                event.dispatch(handler)
                event.dispatch(self._global_handler)
                previous = type
                self._previous = type
                collector.pop()
            elif not self._stop and (self._timers > 0 or self._selectables > 1):
                if previous is not Event.REACTOR_QUIESCED and self._previous is not Event.REACTOR_FINAL:
                    self.push_event(self, Event.REACTOR_QUIESCED)
                self.yield_()
            else:
                if self._selectable:
                    self._selectable.terminate()
                    self._selectable.update()
                    self._selectable = None
                else:
                    if self._previous is not Event.REACTOR_FINAL:
                        self.push_event(self, Event.REACTOR_FINAL)
                    return False


def container(*handlers: Any, fast_delivery: Callable[[Any], bool] | None = None, **kwargs: Any) -> Container:
    """A :class:`FastContainer` (``fast_delivery``: its callback, module doc)
    with :class:`SafeIOHandler`; ``proton.reactor.Container``'s arguments."""
    kwargs.setdefault("global_handler", SafeIOHandler())
    c = FastContainer(*handlers, **kwargs)
    c.fast_delivery = fast_delivery
    return c
