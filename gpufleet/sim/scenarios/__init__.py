"""Shipped scenario files (YAML); a package only so they install as package data."""
