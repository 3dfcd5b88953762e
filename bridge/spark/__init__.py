"""Spark side of lakegate: the session factory, the capture-log data source,
the streaming pipeline's Spark steps. Modules here import pyspark; the rest of
``bridge`` does not need it."""
