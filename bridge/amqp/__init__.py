"""AMQP 1.0 forwarding: the seed's MQTT -> AMQP mapping, a pipelining proton
sender, and the Spark foreachBatch sink that runs it on the executors.

* :mod:`bridge.amqp.mapping` -- pure: a FORWARD_DDL row -> a proton Message,
  its target address and link (tables per profile, as data);
* :mod:`bridge.amqp.wire` -- the same rules written straight to AMQP bytes
  (what the Forwarder sends; checked against proton's encoding);
* :mod:`bridge.amqp.sender` -- :class:`~bridge.amqp.sender.Forwarder`, with
  :mod:`~bridge.amqp.results` (``ForwardResult``, ``ForwardError``) and the
  proton engine on its thread, :mod:`~bridge.amqp.engine`, composed of
  :mod:`~bridge.amqp.batches`, :mod:`~bridge.amqp.connection`,
  :mod:`~bridge.amqp.links` and :mod:`~bridge.amqp.deliveries`, with
  :mod:`~bridge.amqp.retry` (permanent conditions, backoff);
* :mod:`bridge.amqp.sink` -- ``forward_batch(df, batch_id, config)``;
* :mod:`bridge.amqp.forwarded` -- the forward-acknowledgement channel the
  edge reads (:class:`~bridge.amqp.forwarded.ForwardedOffsets`);
* :mod:`bridge.amqp.trouble` -- what the executors' Forwarders are failing
  on while they retry, for ``lakegate status``.

Importing this package imports neither proton nor Spark.
"""
