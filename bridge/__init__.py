"""lakegate: an MQTT edge that captures durably, a Spark job that keeps MQTT
retained state in Delta tables, and AMQP 1.0 forwarding.

See ARCHITECTURE.md for where each piece lives.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
