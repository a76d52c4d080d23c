"""Benchmark scripts, one per performance target.

Each script prints its figure beside a baseline measured in the same run (the
slower way it replaces, or the earlier behaviour), so a change of machine moves
both alike, and ends with one JSON line for a machine to read.  Run one from
the checkout in the development environment (``make install`` puts the
checkout on that environment's path) as ``python bench/<name>.py`` or
``python -m bench.<name>``; ``--help`` says what each measures.  The scripts
import each other and ``testsupport`` by name, as modules of this package, and
never ship in the wheel.
"""
