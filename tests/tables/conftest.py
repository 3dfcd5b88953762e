"""Fixtures for the command tests of tests/tables."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def bridge_log_level():
    """``lakegate sql`` and ``compact`` quiet the bridge loggers for their process; put the level back."""
    logger = logging.getLogger("bridge")
    level = logger.level
    yield
    logger.setLevel(level)
