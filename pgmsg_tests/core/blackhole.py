"""A silent network partition (no FIN, no RST) between worker processes and PostgreSQL.

A proxy that only stops forwarding is no partition: its kernel still acknowledges the worker's
bytes and keepalive probes, so the worker's sockets never look dead. Here the packets
themselves are dropped: the proxy listens inside a network namespace of its own (its loopback
only), the workers run in that namespace (``prefix``), and the proxy forwards to PostgreSQL
from the test's namespace. ``blackhole()`` puts tc's blackhole qdisc on the namespace's
loopback (every packet between the workers and the proxy is dropped; both ends keep their
sockets open, nothing tells either side), ``restore()`` takes it off (new connections pass).
``forget()`` is a firewall that forgets the connections open now: their packets are dropped
from then on (policy routing rules on the workers' ports), while new connections pass.
Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN), unshare, nsenter and tc.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import shutil
import socket
import subprocess
import threading

CLONE_NEWNET = 0x40000000


def available() -> str:
    """Why the proxy cannot run here ('' when it can)."""
    if os.geteuid() != 0:
        return "needs root (a network namespace and tc)"
    missing = [tool for tool in ("unshare", "nsenter", "tc", "ip") if not shutil.which(tool)]
    return f"needs {', '.join(missing)}" if missing else ""


class BlackholeProxy:
    def __init__(self, target: tuple[str, int] | str) -> None:
        """``target``: PostgreSQL's (host, port), or the path of its Unix socket."""
        self.target = target
        self.closed = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        # A process that holds the namespace; its loopback is down until set up. The local
        # table's rule moves behind room for forget()'s rules.
        setup = (
            "ip link set lo up && ip rule del pref 0 table local && "
            "ip rule add pref 100 table local && echo up && exec sleep 3600"
        )
        self._holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", setup],
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._holder.stdout.readline().strip() != "up":
            raise RuntimeError("could not set up a network namespace")
        self.namespace = f"/proc/{self._holder.pid}/ns/net"
        self.prefix = ["nsenter", f"--net={self.namespace}", "--"]
        self.listener = self._listen_inside()
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="blackhole-proxy").start()

    def _listen_inside(self) -> socket.socket:
        """A listening socket in the namespace: made by a thread that entered it (setns moves
        only the calling thread; a socket stays in the namespace it was made in)."""
        made: list = []

        def enter_and_listen() -> None:
            try:
                fd = os.open(self.namespace, os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
                made.append(socket.create_server(("127.0.0.1", 0)))
            except OSError as exc:
                made.append(exc)

        thread = threading.Thread(target=enter_and_listen)
        thread.start()
        thread.join()
        if isinstance(made[0], OSError):
            raise made[0]
        return made[0]

    def _tc(self, *args: str) -> None:
        subprocess.run([*self.prefix, "tc", "qdisc", *args], check=True)

    def blackhole(self) -> None:
        """Drop every packet between the workers and the proxy, from now on."""
        self._tc("add", "dev", "lo", "root", "blackhole")

    def restore(self) -> None:
        self._tc("del", "dev", "lo", "root")

    def forget(self) -> None:
        """Drop every packet of the connections open now, for good; new ones pass."""
        with self._lock:
            ports = [client.getpeername()[1] for client, _ in self._pairs if not self.closed]
        for port in ports:
            for side in ("sport", "dport"):
                rule = ["ip", "rule", "add", "pref", "10", "ipproto", "tcp", side, str(port)]
                subprocess.run([*self.prefix, *rule, "blackhole"], check=True)

    def close(self) -> None:
        self.closed = True
        _close(self.listener)
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _close(sock)
        self._holder.kill()
        self._holder.wait()
        self._holder.stdout.close()

    def _upstream(self) -> socket.socket:
        if isinstance(self.target, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(self.target)
            return sock
        return socket.create_connection(self.target, timeout=5)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = self._upstream()
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        upstream.settimeout(None)
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        try:
            while not self.closed:
                for key, _ in selector.select(timeout=0.5):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            _close(client)
            _close(upstream)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
