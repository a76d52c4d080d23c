"""One NFS mount's RPC figures judged: the same verdict on the node and in the fleet."""

from __future__ import annotations

from gpufleet.detectconfig import DetectorConfig


def nfs_verdict(
    ops: int | None,
    retrans: int | None,
    timeouts: int | None,
    queue_ms: float | None,
    rtt_ms: float | None,
    cfg: DetectorConfig,
) -> tuple[str, str]:
    """The status (``ok``, ``warn``, ``fail``) of one NFS mount's figures over an interval, and why.

    ``host_misconfig`` in the fleet and ``gpufleet diagnose`` on the node
    both judge a mount by this, with the same thresholds.
    """
    if (retrans or 0) > 0 or (timeouts or 0) > 0:
        return "fail", f"{retrans or 0} retransmissions, {timeouts or 0} major timeouts"
    if ops is None or ops < cfg.nfs_min_ops:
        return "ok", f"{ops or 0} RPCs: too few to judge latency"
    if queue_ms is not None and queue_ms >= cfg.nfs_stall_queue_ms:
        return "fail", f"RPCs wait {queue_ms:.1f} ms in the backlog before being sent"
    if rtt_ms is not None and rtt_ms >= cfg.nfs_stall_rtt_ms:
        return "warn", f"round trip {rtt_ms:.1f} ms per RPC"
    return "ok", f"{ops} RPCs, backlog wait {queue_ms or 0:.2f} ms, round trip {rtt_ms or 0:.2f} ms"
