"""Prometheus metrics and ``/healthz`` of ``lakegate run`` (``metrics.*``).

:mod:`.collect` reads the edge's, the capture log's and the job's own
counters when Prometheus scrapes (nothing is added to the hot paths) and
keeps the one histogram the job feeds per batch; :mod:`.http` serves
``/metrics`` (Prometheus text format, ``prometheus_client``) and
``/healthz`` on a thread of its own, never on the edge's event loop or the
job's thread.
"""
