"""A StreamingQueryListener base whose progress events cross py4j as one JSON string.

PySpark hands a Python listener each progress event as a ``StreamingQueryProgress``
built by ``fromJObject``: one py4j round trip per field, per source and per
map entry (ids, name, durations, each source's offsets and metrics, the
sink...), some fifty per micro-batch, on the listener bus thread and in the
driver's Python process, where they compete with the batch's own py4j calls
and the edge for the GIL. :class:`JsonEventListener` asks the JVM for the
event's JSON instead (``progress.json()``, one call) and builds the same
object with ``fromJson`` (the path Spark Connect uses). Other events keep
PySpark's conversion; they are rare.

This replaces the private ``_jlistener`` property of PySpark's
``StreamingQueryListener`` (pyspark 4.x: ``PythonStreamingQueryListenerWrapper``
around an object implementing ``PythonStreamingQueryListener``); a test
checks that events still arrive with every field the job reads.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (QueryIdleEvent, QueryProgressEvent, QueryStartedEvent,
                                            QueryTerminatedEvent)

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject

__all__ = ["JsonEventListener", "progress_event"]


def progress_event(jevent: "JavaObject") -> QueryProgressEvent:
    """A JVM ``QueryProgressEvent`` as PySpark's, from its JSON (one py4j call)."""
    return QueryProgressEvent.fromJson({"progress": json.loads(jevent.progress().json())})


class _JsonEvents:
    """The py4j callback object (implements the JVM interface)."""

    def __init__(self, pylistener: StreamingQueryListener) -> None:
        self.pylistener = pylistener

    def onQueryStarted(self, jevent: "JavaObject") -> None:
        self.pylistener.onQueryStarted(QueryStartedEvent.fromJObject(jevent))

    def onQueryProgress(self, jevent: "JavaObject") -> None:
        self.pylistener.onQueryProgress(progress_event(jevent))

    def onQueryIdle(self, jevent: "JavaObject") -> None:
        self.pylistener.onQueryIdle(QueryIdleEvent.fromJObject(jevent))

    def onQueryTerminated(self, jevent: "JavaObject") -> None:
        self.pylistener.onQueryTerminated(QueryTerminatedEvent.fromJObject(jevent))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class JsonEventListener(StreamingQueryListener):
    """Subclass instead of ``StreamingQueryListener``; see the module doc."""

    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        if "_jlistenerobj" not in self.__dict__:
            jvm = SparkContext._jvm  # noqa: SLF001 - py4j handle, as PySpark's own property
            self.__dict__["_jlistenerobj"] = jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))
        return self.__dict__["_jlistenerobj"]
