"""Rows made from capture records without Spark, needed alike by the edge's
process (live forwarding), the AMQP forwarder and the job's driver path:

* ``arrow_frames``: capture records (Arrow) -> frame rows (Arrow), the twin
  of the job's parse step;
* ``forward_rows``: the rows AMQP forwarding sends, from a batch on the
  driver, the twin of the job's Spark projection.

Below ``tables``, ``amqp``, ``edge`` and ``job`` (ARCHITECTURE.md, the
import contract in pyproject.toml); imports only ``parse`` and ``schemas``.
"""
