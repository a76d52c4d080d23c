"""Detectors: pure functions over windows of samples.

The live sweep, ``gpufleet replay`` and the tests run the same code.
"""
