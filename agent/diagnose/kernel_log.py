"""The kernel log on the checklist: XIDs, hung tasks, NFS servers not responding.

``dmesg`` is where a node says what no counter does: the NVIDIA driver logs
every XID (``NVRM: Xid (PCI:0000:9b:00): 119, ...``), the hung-task watchdog
names tasks stuck in uninterruptible sleep (``INFO: task python:1234 blocked
for more than 120 seconds.``), and the NFS client says when a server stops
answering (``nfs: server fs01 not responding, still trying``) and when it is
back (``nfs: server fs01 OK``).

Reading the log sits behind one small seam, :class:`KernelLog`, so the
checks judge the same lines whether they came from ``/dev/kmsg`` (what the
agent reads: ``prio,seq,usec,flags;text``), the ``dmesg`` command, the
systemd journal (``journalctl -k``) or a saved file; the parsers accept every
layout these print (``[  12.345678]`` seconds since boot, ``--ctime``,
``--time-format iso`` with or without ``--decode``, ``<4>`` priorities,
syslog's ``host kernel:`` prefix).  A log that cannot be read (no
permission with ``kernel.dmesg_restrict=1``, no ``dmesg``) skips the items
with that reason; nothing is guessed.

Only lines within ``window_s`` of now are judged; older ones are counted in
the evidence.  A line with no time at all (a saved excerpt) counts as recent.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.agent.diagnose.result import Check, skipped
from gpufleet.xid import describe, hardware

if TYPE_CHECKING:
    from gpufleet.agent.diagnose.view import NodeView

#: Lines older than this are history, not a verdict on the node now, seconds.
DEFAULT_WINDOW_S = 6 * 3600.0
#: Most bytes read from a command or file (the kernel's ring buffer is 1 MiB at most by default).
MAX_LOG_BYTES = 16 * 1024 * 1024

XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")
HUNG_RE = re.compile(r"INFO: task (.+?):(\d+) blocked for more than (\d+) seconds")
NFS_DOWN_RE = re.compile(r"\bnfs: server (\S+) not responding")
NFS_OK_RE = re.compile(r"\bnfs: server (\S+) OK\b")
OOM_RE = re.compile(r"Killed process (\d+) \(([^)]*)\)|Out of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")

_MONO = re.compile(r"^\s*(?:<\d+>)?\[\s*(\d+\.\d+)\]\s?(.*)$")
_CTIME = re.compile(r"^\s*(?:<\d+>)?\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]\s?(.*)$")
_ISO = re.compile(
    r"^(?:\w+\s*:\s*\w+\s*:\s*)?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?([+-]\d\d:?\d\d|Z)?\s?(.*)$"
)
_SYSLOG = re.compile(r"^(?:\d{4}-\d\d-\d\dT\S+|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) \S+ kernel: ?(.*)$")


@dataclass(frozen=True)
class KernelLine:
    text: str
    #: Seconds since boot, where the line carries them (``/dev/kmsg``, ``[  12.3]`` stamps).
    boot_s: float | None = None
    #: Wall-clock time (epoch seconds), where the line carries it (``--ctime``, ISO stamps).
    epoch: float | None = None


class KernelLogUnavailable(RuntimeError):
    """The log cannot be read here; the message says why (for the skipped items)."""


class KernelLog(Protocol):
    #: What was read, for the evidence (``/dev/kmsg``, ``dmesg``, a file name).
    name: str

    def read(self) -> list[KernelLine]:
        """Every line available. Raises KernelLogUnavailable."""
        ...


# --------------------------------------------------------------------------- parsing


def parse_kmsg(text: str) -> list[KernelLine]:
    """``/dev/kmsg`` records: ``prio,seq,usec,flags[,...];message``; continuation lines (`` KEY=value``) skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith(" "):
            continue
        head, sep, msg = line.partition(";")
        parts = head.split(",")
        if not sep or len(parts) < 3:
            continue
        try:
            usec = int(parts[2])
        except ValueError:
            continue
        out.append(KernelLine(msg, boot_s=usec / 1e6))
    return out


def _iso_epoch(stamp: str, frac: str | None, zone: str | None) -> float | None:
    try:
        if zone in (None, ""):
            t = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp()
        else:
            z = "+00:00" if zone == "Z" else zone if ":" in zone else f"{zone[:3]}:{zone[3:]}"
            t = datetime.fromisoformat(stamp + z).timestamp()
    except ValueError:
        return None
    return t + (float(f"0.{frac}") if frac else 0.0)


def parse_dmesg_line(line: str) -> KernelLine | None:
    if not line.strip():
        return None
    if m := _SYSLOG.match(line):
        inner = parse_dmesg_line(m.group(1))
        return inner if inner is not None else KernelLine(m.group(1))
    if m := _MONO.match(line):
        return KernelLine(m.group(2), boot_s=float(m.group(1)))
    if m := _CTIME.match(line):
        try:
            epoch = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
        except ValueError:
            epoch = None
        return KernelLine(m.group(2), epoch=epoch)
    if m := _ISO.match(line):
        return KernelLine(m.group(4), epoch=_iso_epoch(m.group(1), m.group(2), m.group(3)))
    return KernelLine(line.strip())


def parse_dmesg(text: str) -> list[KernelLine]:
    """What ``dmesg`` (any of its time formats), ``journalctl -k`` or a saved log prints, a line at a time."""
    return [k for k in (parse_dmesg_line(x) for x in text.splitlines()) if k is not None]


# --------------------------------------------------------------------------- sources


@dataclass
class DevKmsg:
    """``/dev/kmsg``: every record in the ring buffer, without blocking."""

    path: Path = Path("/dev/kmsg")
    name: str = "/dev/kmsg"

    def read(self) -> list[KernelLine]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError as e:
            raise KernelLogUnavailable(f"{self.path} does not exist") from e
        except PermissionError as e:
            raise KernelLogUnavailable(
                f"no permission to read {self.path} (kernel.dmesg_restrict=1?): run as "
                "root or with CAP_SYSLOG"
            ) from e
        except OSError as e:
            raise KernelLogUnavailable(f"cannot open {self.path}: {e.strerror}") from e
        records: list[str] = []
        size = 0
        try:
            while size < MAX_LOG_BYTES:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.EPIPE:  # the record was overwritten while we read: go on
                        continue
                    if e.errno == errno.EINVAL:
                        break
                    raise KernelLogUnavailable(f"cannot read {self.path}: {e.strerror}") from e
                if not chunk:
                    break
                size += len(chunk)
                records.append(chunk.decode("utf-8", "replace"))
        finally:
            os.close(fd)
        return parse_kmsg("".join(records))


@dataclass
class CommandLog:
    """A command that prints the kernel log (``dmesg``, ``journalctl -k``)."""

    argv: Sequence[str]
    timeout_s: float = 20.0
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or " ".join(self.argv)

    def read(self) -> list[KernelLine]:
        exe = shutil.which(self.argv[0])
        if exe is None:
            raise KernelLogUnavailable(f"{self.argv[0]} not found on PATH")
        try:
            p = subprocess.run(
                [exe, *self.argv[1:]], capture_output=True, timeout=self.timeout_s, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise KernelLogUnavailable(f"{self.name} did not finish in {self.timeout_s:g} s") from e
        except OSError as e:
            raise KernelLogUnavailable(f"{self.name}: {e.strerror}") from e
        err = p.stderr.decode("utf-8", "replace").strip()
        if p.returncode != 0:
            why = (
                "no permission (kernel.dmesg_restrict=1?)"
                if "permitted" in err or "denied" in err.lower()
                else err[-200:] or f"exit status {p.returncode}"
            )
            raise KernelLogUnavailable(f"{self.name}: {why}")
        return parse_dmesg(p.stdout[:MAX_LOG_BYTES].decode("utf-8", "replace"))


@dataclass
class FileLog:
    """A saved log (``dmesg`` output, ``/var/log/kern.log``, a ``/dev/kmsg`` dump)."""

    path: Path
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or str(self.path)

    def read(self) -> list[KernelLine]:
        try:
            with open(self.path, "rb") as f:
                text = f.read(MAX_LOG_BYTES).decode("utf-8", "replace")
        except OSError as e:
            raise KernelLogUnavailable(f"cannot read {self.path}: {e.strerror}") from e
        first = next((x for x in text.splitlines() if x.strip()), "")
        return parse_kmsg(text) if re.match(r"^\d+,\d+,\d+,", first) else parse_dmesg(text)


@dataclass
class FirstReadable:
    """The first of several logs that can be read; the reasons of all when none can."""

    logs: Sequence[KernelLog]
    name: str = ""

    def read(self) -> list[KernelLine]:
        why = []
        for log in self.logs:
            try:
                lines = log.read()
            except KernelLogUnavailable as e:
                why.append(str(e))
                continue
            self.name = log.name
            return lines
        raise KernelLogUnavailable("; ".join(why) or "no kernel log configured")


def default_log(dev: Path = Path("/dev/kmsg")) -> KernelLog:
    """``/dev/kmsg``, then ``dmesg``, then the journal's kernel messages."""
    return FirstReadable(
        [
            DevKmsg(dev),
            CommandLog(["dmesg", "--nopager"]),
            CommandLog(["journalctl", "-k", "-b", "-o", "short-iso", "--no-pager", "-q"]),
        ]
    )


# --------------------------------------------------------------------------- findings


@dataclass
class KernelFindings:
    """What the log says, within the window (``recent``) and before it (``older``)."""

    source: str
    window_s: float
    #: XID code -> PCI bus ids it was logged for, within the window.
    xids: dict[int, set[str]] = field(default_factory=dict)
    xid_lines: int = 0
    hung: dict[str, int] = field(default_factory=dict)
    #: NFS server -> still not responding at the last word (True) or back OK (False).
    nfs: dict[str, bool] = field(default_factory=dict)
    nfs_lines: int = 0
    oom: list[str] = field(default_factory=list)
    older: dict[str, int] = field(default_factory=dict)
    undated: int = 0
    lines: int = 0
    error: str | None = None


def _age(line: KernelLine, now: float, uptime_s: float | None) -> float | None:
    if line.epoch is not None:
        return now - line.epoch
    if line.boot_s is not None and uptime_s is not None:
        return uptime_s - line.boot_s
    return None


def scan(
    lines: list[KernelLine],
    source: str,
    now: float,
    uptime_s: float | None,
    window_s: float = DEFAULT_WINDOW_S,
) -> KernelFindings:
    f = KernelFindings(source, window_s, lines=len(lines))
    for line in lines:
        text = line.text
        kind = (
            "xid"
            if "NVRM: Xid" in text
            else "hung"
            if "blocked for more than" in text
            else "nfs"
            if "nfs: server" in text
            else "oom"
            if ("Killed process" in text or "Out of memory" in text)
            else None
        )
        if kind is None:
            continue
        age = _age(line, now, uptime_s)
        if age is None:
            f.undated += 1
        elif age > window_s:
            f.older[kind] = f.older.get(kind, 0) + 1
            continue
        if kind == "xid" and (m := XID_RE.search(text)):
            f.xids.setdefault(int(m.group(2)), set()).add(m.group(1).lower())
            f.xid_lines += 1
        elif kind == "hung" and (m := HUNG_RE.search(text)):
            task = m.group(1)
            f.hung[task] = f.hung.get(task, 0) + 1
        elif kind == "nfs":
            if m := NFS_DOWN_RE.search(text):
                f.nfs[m.group(1)] = True
                f.nfs_lines += 1
            elif m := NFS_OK_RE.search(text):
                f.nfs[m.group(1)] = False
                f.nfs_lines += 1
        elif kind == "oom" and (m := OOM_RE.search(text)):
            f.oom.append(m.group(2) or m.group(4) or "?")
    return f


def read_findings(
    log: KernelLog | None, now: float, uptime_s: float | None, window_s: float = DEFAULT_WINDOW_S
) -> KernelFindings:
    if log is None:
        return KernelFindings("", window_s, error="the kernel log is not read here")
    try:
        lines = log.read()
    except KernelLogUnavailable as e:
        return KernelFindings(log.name, window_s, error=str(e))
    return scan(lines, log.name, now, uptime_s, window_s)


# --------------------------------------------------------------------------- checks


def _span(f: KernelFindings) -> str:
    return f"in the last {f.window_s / 3600:g} h of {f.source}"


def _base_ev(f: KernelFindings, kind: str) -> dict[str, Any]:
    return {
        "source": f.source,
        "window_s": f.window_s,
        "lines": f.lines,
        "older": f.older.get(kind, 0),
        "undated": f.undated,
    }


def check_xids(view: NodeView) -> Check:
    f = view.kernel
    if f is None or f.error is not None:
        return skipped(
            "kernel_xid", "node", f"kernel log not readable: {f.error if f else 'not sampled'}", "XIDs"
        )
    ev = _base_ev(f, "xid")
    ev["xids"] = {str(c): sorted(buses) for c, buses in sorted(f.xids.items())}
    if not f.xids:
        return Check("kernel_xid", "node", "ok", f"no XID {_span(f)}", 0, "XIDs", "", ev)
    hw = sorted(c for c in f.xids if hardware(c))
    names = ", ".join(f"{c} ({info.name})" if (info := describe(c)) else str(c) for c in sorted(f.xids))
    buses = sorted({b for c in f.xids for b in f.xids[c]})
    text = f"XID {names} on {', '.join(buses)} {_span(f)}"
    if hw:
        return Check(
            "kernel_xid",
            "node",
            "fail",
            text,
            f.xid_lines,
            "XIDs",
            f"XID {', '.join(map(str, hw))} points at the GPU, its memory or its links: drain the node "
            "and run dcgmi diag -r 3 on the GPU",
            ev,
        )
    actions = {info.action for c in f.xids if (info := describe(c))}
    decision = (
        "reset the GPU (nvidia-smi -r) when it is idle"
        if "reset_gpu" in actions or "drain_node" in actions
        else "the job's own faults: check the application (the GPU is not implicated)"
    )
    return Check("kernel_xid", "node", "warn", text, f.xid_lines, "XIDs", decision, ev)


def check_hung_tasks(view: NodeView) -> Check:
    f = view.kernel
    if f is None or f.error is not None:
        return skipped(
            "hung_tasks", "node", f"kernel log not readable: {f.error if f else 'not sampled'}", "tasks"
        )
    ev = {**_base_ev(f, "hung"), "tasks": dict(sorted(f.hung.items()))}
    if not f.hung:
        return Check("hung_tasks", "node", "ok", f"no hung task {_span(f)}", 0, "tasks", "", ev)
    n = sum(f.hung.values())
    who = ", ".join(sorted(f.hung)[:5])
    return Check(
        "hung_tasks",
        "node",
        "fail",
        f"{n} hung-task report(s) ({who}) {_span(f)}",
        n,
        "tasks",
        "tasks stuck in uninterruptible sleep: the I/O path (NFS, local disk) or a driver is not "
        "answering; check the NFS and disk items and the call traces in dmesg",
        ev,
    )


def check_nfs_servers(view: NodeView) -> Check:
    f = view.kernel
    if f is None or f.error is not None:
        return skipped(
            "nfs_server", "node", f"kernel log not readable: {f.error if f else 'not sampled'}", "servers"
        )
    ev = {
        **_base_ev(f, "nfs"),
        "servers": {s: ("not responding" if down else "recovered") for s, down in sorted(f.nfs.items())},
    }
    if not f.nfs:
        return Check(
            "nfs_server", "node", "ok", f"no NFS server stopped answering {_span(f)}", 0, "servers", "", ev
        )
    down = sorted(s for s, d in f.nfs.items() if d)
    if down:
        return Check(
            "nfs_server",
            "node",
            "fail",
            f"NFS server {', '.join(down)} not responding {_span(f)}",
            len(down),
            "servers",
            "the data path is stalled on the NFS server: check the server and the "
            "network to it; jobs reading from it wait in D state",
            ev,
        )
    back = sorted(f.nfs)
    return Check(
        "nfs_server",
        "node",
        "warn",
        f"NFS server {', '.join(back)} stopped answering and came back {_span(f)}",
        len(back),
        "servers",
        "intermittent NFS stalls hold the loaders back: check the server's load and the network",
        ev,
    )


def kernel_view(
    log: KernelLog | None,
    uptime_s: float | None,
    clock: Callable[[], float] = time.time,
    window_s: float = DEFAULT_WINDOW_S,
) -> KernelFindings:
    return read_findings(log, clock(), uptime_s, window_s)
