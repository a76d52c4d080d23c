"""Report a training run's progress to gpufleet: tokens, samples and steps, cumulative.

gpufleet measures a run's energy and cost from its GPUs; progress reports
turn them into tokens per joule, MFU and goodput.  This package is small and
uses the standard library only, so any training job can install it::

    from gpufleet_client import report_progress
    report_progress("llm-7b", tokens=step * tokens_per_step, steps=step)

Counts are cumulative since the run started.  Reports are batched: the
latest count of each run is sent every ``interval_s`` by a background
thread (and at exit), so calling it every step costs a dictionary update.
Network errors and refusals never reach the training loop: they are counted
(:attr:`ProgressReporter.stats`), logged at a limited rate, and the latest
count is sent again later (counts are cumulative, so a lost report loses
nothing).  Only a call that could never be right raises ``ValueError`` (no
count given, a negative or non-finite count).

Configuration, for :func:`report_progress` and the callbacks:
``GPUFLEET_API_URL`` (the gpufleet API), ``GPUFLEET_TOKEN`` (a token allowed
to write runs: an admin token, or the node token of a node the run uses) and
``GPUFLEET_RUN_ID`` (the run, when not given).
"""

from gpufleet_client.reporter import ProgressReporter, ReporterStats, default_reporter, report_progress

__all__ = ["ProgressReporter", "ReporterStats", "default_reporter", "report_progress"]
__version__ = "0.1.0"
