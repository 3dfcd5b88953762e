"""The MQTT edge: devices connect to it as to any MQTT 3.1 / 3.1.1 / 5 broker.

It validates every packet with :mod:`bridge.mqtt`, captures every frame it
accepts (and every frame it rejects, marked) into the capture log, and
acknowledges QoS 1/2 only once the frame is durable. It is the session
layer: retained state and forwarding belong to the Spark job.

* :mod:`bridge.edge.session` -- the per-connection state machine (sans-IO),
  with its parts :mod:`bridge.edge.handshake` (CONNECT), :mod:`bridge.edge.inbound`
  (PUBLISH and QoS flows, other packets), :mod:`bridge.edge.subscribing`
  (SUBSCRIBE, UNSUBSCRIBE), :mod:`bridge.edge.sending` (the subscriber's
  acknowledgements, sending), :mod:`bridge.edge.actions` (what it returns)
  and :mod:`bridge.edge.records` (rejected and redacted frames);
* :mod:`bridge.edge.state` -- session state that outlives a connection
  (QoS 2 Packet Identifiers awaiting PUBREL), :mod:`bridge.edge.persist` --
  its snapshot and its recovery from the capture log;
* :mod:`bridge.edge.auth` -- the password file (``lakegate passwd``);
* :mod:`bridge.edge.server` -- the asyncio TCP/TLS server (``lakegate edge``),
  with :mod:`bridge.edge.connection` (one connection), :mod:`bridge.edge.connecting`
  (the CONNECT decision), :mod:`bridge.edge.acks`
  (acknowledgements on durability and forwarding), :mod:`bridge.edge.incomplete`
  (incomplete-frame limits), :mod:`bridge.edge.housekeeping` (Wills, session
  expiry, snapshots) and :mod:`bridge.edge.thread` (``EdgeThread``);
  :mod:`bridge.edge.admission` -- which password checks run when.
"""

__all__: list[str] = []
