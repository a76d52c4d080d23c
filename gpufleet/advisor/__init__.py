"""Advice computed from the fleet's own data (see each module)."""
