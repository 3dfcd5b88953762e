"""Benchmarks behind ``lakegate bench NAME`` (see ``bridge.commands.bench``)."""
