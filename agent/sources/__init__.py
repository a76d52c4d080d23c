"""Telemetry sources: one module per source behind the ``Source`` protocol."""
