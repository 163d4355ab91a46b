"""A loopback TCP proxy that breaks connections on purpose: the network of the fault tests.

Put between a client and a server on 127.0.0.1, it forwards bytes both ways
until told to misbehave, as home networks and VPNs do:

- ``cut()`` closes every open connection now (a dropped link);
- ``cut_after(n, when=…)`` closes the next connection that ``when`` picks
  once *n* bytes of its answer have passed (a download cut part-way), or of
  its request with ``direction="up"`` (an upload cut part-way);
  ``times`` says how many connections in a row;
- ``blackhole()`` stops forwarding and holds every connection open, new ones
  too, so requests hang as they do when packets are dropped; ``heal()`` ends
  every fault;
- ``delay(seconds)`` holds each chunk that long before passing it on (a slow
  link whose bytes still all arrive);
- ``throttle(bytes_per_s, direction)`` caps one direction's rate.

``carrying(when)`` says how many open connections ``when`` picks: a request
still under way.

Directions are named from the client: ``"up"`` is client → server, ``"down"``
server → client. ``when`` sees the first bytes the client sent on that
connection (an HTTP request line, say), so a rule can pick one kind of
request; for an encrypted protocol (ssh) it picks every connection.

It is bounded so that a test that forgets it cannot leave it behind: it
listens on 127.0.0.1 only and forwards only to 127.0.0.1, stops by itself
after ``lifetime_s``, and refuses a connection once ``max_bytes`` have passed
in all. Each connection is two threads; that is plenty for a test.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

CHUNK = 16 * 1024
TICK_S = 0.05


@dataclass
class _CutRule:
    after: int
    times: int
    when: Callable[[bytes], bool]
    direction: str = "down"


class _Link:
    """One proxied connection: the client's socket, the server's, and what passed."""

    def __init__(self, proxy: "TcpProxy", client: socket.socket, server: socket.socket):
        self.proxy, self.client, self.server = proxy, client, server
        self.first = b""          # the first bytes the client sent
        self.down = 0             # bytes passed server -> client
        self.up = 0               # bytes passed client -> server
        self.rule: _CutRule | None = None
        self.closed = threading.Event()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TcpProxy:
    """Listens on 127.0.0.1:``port`` and forwards to 127.0.0.1:``target_port`` (see the module docstring)."""

    def __init__(self, target_port: int, *, port: int = 0, lifetime_s: float = 1800,
                 max_bytes: int = 2 * 1024 ** 3):
        self.target_port = target_port
        self.lifetime_s = lifetime_s
        self.max_bytes = max_bytes
        self.passed = 0
        self.cuts = 0             # connections closed by a rule or by cut()
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._rules: list[_CutRule] = []
        self._blackhole = False
        self._delay = 0.0
        self._rates: dict[str, float] = {}
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(TICK_S)
        self.port = self._listener.getsockname()[1]
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._accept, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------- faults
    def cut(self) -> int:
        """Close every open connection; return how many there were."""
        with self._lock:
            links, self._links = self._links, []
            self.cuts += len(links)
        for link in links:
            link.close()
        return len(links)

    def cut_after(self, nbytes: int, *, times: int = 1, when: Callable[[bytes], bool] = lambda first: True,
                  direction: str = "down") -> None:
        """Close the next *times* connections that *when* picks once *nbytes* of their answers passed
        (or of their requests, with *direction* ``"up"``: the server never gets the whole request)."""
        assert direction in ("up", "down")
        with self._lock:
            self._rules.append(_CutRule(nbytes, times, when, direction))

    def carrying(self, when: Callable[[bytes], bool]) -> int:
        """How many open connections *when* picks (by the first bytes their client sent)."""
        with self._lock:
            return sum(1 for link in self._links if link.first and when(link.first))

    def blackhole(self) -> None:
        self._blackhole = True

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def throttle(self, bytes_per_s: float, direction: str = "down") -> None:
        assert direction in ("up", "down")
        self._rates[direction] = bytes_per_s

    def heal(self) -> None:
        """End every fault: forward everything at once again (rules not yet used are dropped)."""
        with self._lock:
            self._rules.clear()
        self._blackhole, self._delay, self._rates = False, 0.0, {}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self.cut()

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------- forwarding
    def _expired(self) -> bool:
        return self._stop.is_set() or time.monotonic() - self._started > self.lifetime_s

    def _accept(self) -> None:
        while not self._expired():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.passed >= self.max_bytes:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()  # nothing listens there: the client sees its connection closed
                continue
            link = _Link(self, client, server)
            with self._lock:
                self._links.append(link)
            for direction in ("up", "down"):
                threading.Thread(target=self._pump, args=(link, direction), daemon=True,
                                 name=f"tcp-proxy-{self.port}-{direction}").start()
        self.cut()

    def _pick_rule(self, link: _Link) -> None:
        with self._lock:
            for rule in self._rules:
                if rule.times > 0 and rule.when(link.first):
                    rule.times -= 1
                    link.rule = rule
                    break
            self._rules = [r for r in self._rules if r.times > 0]

    def _wait_while_held(self, link: _Link) -> bool:
        """Hold the data while the proxy is a black hole; False once the link or the proxy is gone."""
        while self._blackhole:
            if link.closed.is_set() or self._expired():
                return False
            time.sleep(TICK_S)
        return not link.closed.is_set()

    def _pump(self, link: _Link, direction: str) -> None:
        source, sink = (link.client, link.server) if direction == "up" else (link.server, link.client)
        try:
            source.settimeout(TICK_S)  # the other direction may have cut the link already: then, EBADF
            while not link.closed.is_set() and not self._expired():
                try:
                    data = source.recv(CHUNK)
                except socket.timeout:
                    continue
                if not data:
                    break
                if not self._wait_while_held(link):
                    return
                if direction == "up" and not link.first:
                    link.first = data[:4096]
                    self._pick_rule(link)
                if self._delay:
                    time.sleep(self._delay)
                if link.rule is not None and link.rule.direction == direction:
                    room = link.rule.after - (link.down if direction == "down" else link.up)
                    if len(data) >= room:
                        sink.sendall(data[:max(room, 0)])
                        with self._lock:
                            self.cuts += 1
                        break
                rate = self._rates.get(direction)
                for start in range(0, len(data), 1024 if rate else len(data)):
                    piece = data[start:start + (1024 if rate else len(data))]
                    sink.sendall(piece)
                    if rate:
                        time.sleep(len(piece) / rate)
                if direction == "down":
                    link.down += len(data)
                else:
                    link.up += len(data)
                self.passed += len(data)
        except OSError:
            pass
        finally:
            link.close()
            with self._lock:
                if link in self._links:
                    self._links.remove(link)
