"""Alembic migrations for the gpufleet schema (run with ``gpufleet db upgrade``)."""
