"""Retained messages served to subscribers from the lakehouse: the
``retained`` table's latest version, indexed by topic level
(:mod:`~bridge.edge.retained.index`), overlaid with what this edge captured
after the offsets that version covers (:mod:`~bridge.edge.retained.overlay`)."""
