"""Work as a deterministic count: the Python bytecode instructions a call
executes in one module (a scan that grows with the data shows up here,
unlike in a timing on a shared, noisy machine)."""

from __future__ import annotations

import sys
from typing import Callable

__all__ = ["count_opcodes"]


def count_opcodes(fn: Callable[[], object], filename: str) -> int:
    """Bytecode instructions executed in the file ``filename`` by ``fn()``."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != filename:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count
