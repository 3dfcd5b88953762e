"""Delta tables: messages, retained, quarantine.

* ``retained_rule``: the MQTT retained-message rule as one pure function;
* ``rows``: splitting a micro-batch of parsed frames into table rows (Arrow);
* ``engine``: one interface, two engines (``deltars``: delta-rs, the embedded
  default; ``deltaspark``: delta-spark when its JVM classes are present);
* ``views``: SQL views, time travel and the ``mqtt_match`` SQL function;
* ``maintenance``: compaction, vacuum, expiry of retained messages.
"""
