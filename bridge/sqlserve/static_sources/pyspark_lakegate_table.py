"""Spark's static lookup registers this module's DefaultSource in every session:
``lakegate_table`` (bridge/sqlserve/delta_source.py)."""

from bridge.sqlserve.delta_source import source_class

DefaultSource = source_class('table')
