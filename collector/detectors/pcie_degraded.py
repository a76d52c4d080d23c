"""Degraded PCIe link: a busy GPU whose link trained below its maximum.

GPU-scoped.  PCIe links legitimately drop generation (and on some boards
width) when the GPU idles, so only busy samples count.  A busy sample is
degraded when ``pcie_gen < pcie_gen_max`` or ``pcie_width < pcie_width_max``
(a maximum not reported is taken as the highest value the GPU showed in the
window).  Reported when, since the episode began, at least ``pcie_min_share``
of busy time was degraded, for ``pcie_min_s``, and seen within
``active_within_s``.
"""

from __future__ import annotations

import numpy as np

from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import median_of, num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import PcieDegradedEvidence

KIND = "pcie_degraded"


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not (fr.has("pcie_gen") or fr.has("pcie_width")):
        return []
    cfg = config
    ind = fr.busy & fr.pcie_degraded
    wb = fr.w_busy
    ep = fr.trailing_episode(wb, ind, cfg.pcie_min_share)
    hit = (ep.seconds >= cfg.pcie_min_s) & (ep.share >= cfg.pcie_min_share) & fr.recent_enough(ep.last)
    out = []
    for r in (int(i) for i in np.flatnonzero(hit)):
        sl = fr.row_slice(r)
        onset, last = float(ep.onset[r]), float(ep.last[r])
        m = ind[sl] & (fr.row_times(r) >= onset)
        gen, gen_max = (
            median_of(fr.series_col(r, "pcie_gen"), m),
            median_of(fr.series_col(r, "pcie_gen_max"), m),
        )
        wid, wid_max = (
            median_of(fr.series_col(r, "pcie_width"), m),
            median_of(fr.series_col(r, "pcie_width_max"), m),
        )
        evidence: PcieDegradedEvidence = {
            "pcie_gen": num(gen),
            "pcie_gen_max": num(gen_max),
            "pcie_width": num(wid),
            "pcie_width_max": num(wid_max),
            "degraded_share": num(ep.share[r]),
            "degraded_s": num(ep.seconds[r]),
            "pcie_rx_bytes_s": num(median_of(fr.series_col(r, "pcie_rx_bytes_s"), m)),
            "pcie_tx_bytes_s": num(median_of(fr.series_col(r, "pcie_tx_bytes_s"), m)),
        }
        # Half the lanes or two generations down at least quarters the bandwidth.
        severe = (wid * 2 <= wid_max) or (gen + 2 <= gen_max)
        key = fr.keys[r]
        out.append(
            Finding(
                KIND,
                None,
                "critical" if severe else "warning",
                onset,
                evidence,
                run_id=fr.run_id_at(r, last),
                node=key[0],
                gpu=key[1],
                last_active=last,
            )
        )
    return out
