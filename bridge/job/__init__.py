"""The streaming job: capture source -> parse -> Delta tables -> AMQP forwarding.

* ``context``: capture-record columns and headers -> typed context columns;
* ``batch``: the foreachBatch step (tables, forwarding, maintenance schedule);
* ``pipeline``: builds and starts the streaming query;
* ``progress``: the StreamingQueryListener's one line per batch, and status.
"""
