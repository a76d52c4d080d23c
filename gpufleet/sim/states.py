"""What a GPU can be doing during part of a tick, and how active it is then.

A tick's metrics are the time-weighted mix of these states, so a sampled
value stays exact whatever the sampling interval.  The key distinction for
detectors: in ``WAIT`` (an NCCL collective spinning while a peer is late) a
kernel is running, so GPU-Util reads ~100 %, yet few SMs are active and
power is low; in ``IDLE`` (waiting for input, a checkpoint, model loading)
no kernel runs at all.
"""

from __future__ import annotations

import numpy as np

COMPUTE = 0
COMM = 1
WAIT = 2
IDLE = 3
EVAL = 4
RAMP = 5
FREE = 6
N_STATES = 7

#: States in which the GPU clocks down to its idle clock.
IDLE_STATES = (IDLE, FREE)

#: Share of SMs an NCCL kernel keeps busy while it spins (channels / SMs).
NCCL_SPIN_SM_ACTIVE = 0.18
#: Activity of the all-reduce itself.
COMM_SM_ACTIVE = 0.25
COMM_DRAM_ACTIVE = 0.3
#: Evaluation and warm-up ramp, relative to the run's compute activity.
EVAL_SCALE = (0.6, 0.7, 0.8)  # sm, tensor, dram
RAMP_SCALE = (0.5, 0.3, 0.5)
#: GPU-Util (%) of the ramp and of evaluation (short pauses between kernels).
RAMP_UTIL_PCT = 60.0
EVAL_UTIL_PCT = 90.0


def fixed_levels(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-GPU, per-state (util_pct, sm, tensor, dram) for ``n`` GPUs.

    Rows of GPUs in a run get their COMPUTE/EVAL/RAMP columns from the run's
    workload; everything else is fixed here.
    """
    util = np.zeros((n, N_STATES))
    sm = np.zeros((n, N_STATES))
    tensor = np.zeros((n, N_STATES))
    dram = np.zeros((n, N_STATES))
    util[:, [COMPUTE, COMM, WAIT]] = 100.0
    util[:, EVAL] = EVAL_UTIL_PCT
    util[:, RAMP] = RAMP_UTIL_PCT
    sm[:, COMM] = COMM_SM_ACTIVE
    dram[:, COMM] = COMM_DRAM_ACTIVE
    sm[:, WAIT] = NCCL_SPIN_SM_ACTIVE
    dram[:, WAIT] = 0.01
    return util, sm, tensor, dram
