"""A loopback TCP proxy that injects network faults (tests and benchmarks).

Put it between two processes (agent and collector, collector and
PostgreSQL) and switch its mode while traffic flows:

* ``pass``: forward bytes, optionally ``latency_s`` later in each direction
  (every chunk is delayed, throughput is not limited, order is kept);
* ``reset``: new connections are accepted and reset at once (RST), and
  :meth:`FaultProxy.reset_all` resets the ones already open;
* ``blackhole``: connections are accepted, their bytes read and dropped,
  nothing ever comes back (what a dead route or a hung peer looks like);
* ``refuse``: the listening socket is closed (connection refused) until the
  mode changes, on the same port.

With several upstreams it is a round-robin load balancer that skips an
upstream it cannot connect to, which is what a health-checked LB does for a
replica that died.  It only ever listens on and connects to 127.0.0.1.

:class:`ProxyProcess` runs one in a process of its own, for a caller whose
own threads would otherwise delay every forwarded chunk (a load generator
running a fleet of agents in one interpreter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, Literal, TypeVar

from gpufleet.serverthread import free_port
from testsupport import with_root_on_path

Mode = Literal["pass", "reset", "blackhole", "refuse"]
LOOPBACK = "127.0.0.1"
T = TypeVar("T")


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN, as a crashed peer or a middlebox reset would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstreams: list[int] | int, port: int | None = None) -> None:
        self.upstreams = [upstreams] if isinstance(upstreams, int) else list(upstreams)
        self.port = port or free_port()
        self.mode: Mode = "pass"
        self.latency_s = 0.0
        self.connections_total = 0
        self.resets = 0
        self._rr = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"faultproxy-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    # -- control (any thread) ----------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(RuntimeError, TimeoutError):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def set_mode(self, mode: Mode, latency_s: float | None = None) -> None:
        """Switch the fault; ``refuse`` closes the listener, any other mode reopens it."""
        if latency_s is not None:
            self.latency_s = latency_s
        self.mode = mode
        if mode == "refuse":
            self._call(self._close_listener())
        else:
            self._call(self._listen())
        if mode in ("reset", "refuse"):
            self.reset_all()

    def reset_all(self) -> int:
        """Reset every open connection (both sides); returns how many there were."""
        return self._call(self._reset_all())

    def set_upstreams(self, ports: list[int]) -> None:
        self.upstreams = list(ports)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- inside the loop ---------------------------------------------------------------------

    async def _listen(self) -> None:
        if self._server is not None:
            return
        deadline = time.monotonic() + 5
        while True:
            try:
                self._server = await asyncio.start_server(
                    self._client, LOOPBACK, self.port, reuse_address=True
                )
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _shutdown(self) -> None:
        await self._close_listener()
        await self._reset_all()
        # Let the connection handlers end before the loop stops, rather than be
        # destroyed pending (a warning per connection at interpreter exit).
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reset_all(self) -> int:
        n = len(self._open)
        for down, up in list(self._open):
            _abort(down)
            if up is not None:
                _abort(up)
        self._open.clear()
        self.resets += n
        return n

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        ups = list(self.upstreams)
        for i in range(len(ups)):
            port = ups[(self._rr + i) % len(ups)]
            try:
                conn = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), 2)
            except (OSError, TimeoutError):
                continue
            self._rr = (self._rr + i + 1) % len(ups)
            return conn
        return None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        if self.mode == "reset":
            self.resets += 1
            _abort(writer)
            return
        if self.mode == "blackhole":
            await self._swallow(reader, writer)
            return
        up = await self._connect_upstream()
        if up is None:
            _abort(writer)
            return
        ureader, uwriter = up
        pair = (writer, uwriter)
        self._open.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, uwriter), self._pipe(ureader, writer))
        finally:
            self._open.discard(pair)
            for w in (writer, uwriter):
                w.close()

    async def _swallow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pair = (writer, None)
        self._open.add(pair)
        try:
            while await reader.read(65536):
                pass
        except OSError:
            pass
        finally:
            self._open.discard(pair)
            writer.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy one direction; each chunk leaves ``latency_s`` after it arrived, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                while self.mode == "blackhole":
                    await asyncio.sleep(0.05)
                dst.write(data)
                await dst.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await src.read(65536)
                queue.put_nowait((time.monotonic() + self.latency_s, data))
                if not data:
                    break
            await sender
            if dst.can_write_eof():
                dst.write_eof()
        except (OSError, asyncio.IncompleteReadError):
            sender.cancel()
            _abort(dst)


@contextlib.contextmanager
def fault_proxy(upstreams: list[int] | int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstreams).start()
    try:
        yield proxy
    finally:
        proxy.stop()


class ProxyProcess:
    """A :class:`FaultProxy` in a child process, switched from this one (same methods).

    A proxy thread needs its interpreter's GIL for every chunk it forwards.
    Inside a process that also runs 50 agents, a database round trip through
    it took 0.85 ms at the median, 3.6 ms at p99 and up to 113 ms in two
    minutes (from a child process 0.66, 2.2 and 10 ms; direct 0.19, 1.2 and
    5 ms), so the load generator's own contention showed up as collector
    latency.  The child is
    ``python -m testsupport.faultproxy PORT UPSTREAM...``, driven by one
    JSON line per call on its stdin, answered on its stdout.
    """

    def __init__(self, upstreams: list[int] | int, port: int | None = None) -> None:
        self.upstreams = [upstreams] if isinstance(upstreams, int) else list(upstreams)
        self.port = port or free_port()
        self._proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> ProxyProcess:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "testsupport.faultproxy", str(self.port), *map(str, self.upstreams)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=with_root_on_path(dict(os.environ)),
        )
        self._answer("start")
        return self

    def _answer(self, name: str) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"proxy {name}: the proxy process exited ({self._proc.poll()})")
        ok, value = json.loads(line)
        if not ok:
            raise RuntimeError(f"proxy {name}: {value}")
        return value

    def _call(self, name: str, *args: Any) -> Any:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps([name, args]) + "\n")
        self._proc.stdin.flush()
        return self._answer(name)

    def set_mode(self, mode: Mode, latency_s: float | None = None) -> None:
        self._call("set_mode", mode, latency_s)

    def reset_all(self) -> int:
        n: int = self._call("reset_all")
        return n

    def set_upstreams(self, ports: list[int]) -> None:
        self._call("set_upstreams", ports)

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                self._call("stop")
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()


def _serve(argv: list[str]) -> None:
    """The child's side: run the proxy, apply each call, answer ``[ok, value]``; ``stop`` ends it."""
    proxy = FaultProxy([int(p) for p in argv[1:]], int(argv[0])).start()

    def answer(ok: bool, value: Any) -> None:
        print(json.dumps([ok, value]), flush=True)

    answer(True, proxy.port)
    try:
        for line in sys.stdin:  # EOF: the parent is gone
            name, args = json.loads(line)
            if name == "stop":
                answer(True, None)
                return
            try:
                answer(True, getattr(proxy, name)(*args))
            except (OSError, RuntimeError, TimeoutError, ValueError) as e:
                answer(False, f"{type(e).__name__}: {e}")
    finally:
        proxy.stop()


@contextlib.contextmanager
def proxy_process(upstreams: list[int] | int) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(upstreams).start()
    try:
        yield proxy
    finally:
        proxy.stop()


if __name__ == "__main__":
    _serve(sys.argv[1:])
