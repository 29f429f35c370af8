"""The simulated LAN of bench_scale.py: one network namespace per node, each joined by a veth pair to a bridge
that lives in a namespace of its own, with packet loss and drops done by ``tc`` on each node's link.

Nothing is added to the host's own namespace: the bridge is in ``llms-sw``, every node's address
(``10.213.0.0/24``) exists only inside its ``llms-*`` namespace, and :meth:`Lan.close` (also run on exit, on
SIGINT and SIGTERM) kills every process left in those namespaces and deletes them, which removes the veth
pairs and the bridge with them. A run that was killed with SIGKILL leaves namespaces named ``llms-*``; the
next run deletes them first (:func:`sweep`).

Each node's ``eth0`` carries an HTB root (``1:``) with two classes: ``1:10``, where everything goes by
default, and ``1:20``, whose leaf is a ``bfifo`` of limit 0 that drops every packet it gets. A classic BPF
classifier picks the class: :meth:`Lan.set_loss` installs ``ld rand; jge T`` (a packet goes to ``1:20`` with
probability ``T / 2^32``), :meth:`Lan.drop_all` one that sends every packet there (a firewall dropping the
node's traffic). This is what this machine's kernel offers: it has ``sch_htb``, ``bfifo``, ``cls_bpf`` and
``cls_u32`` but neither ``sch_netem`` nor ``sch_fq`` nor the tc actions, so the fixed delay is added in user
space by ``bench/scale_delay.py`` instead.

Needs root and iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

PREFIX = "llms-"
SWITCH = PREFIX + "sw"
SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000
SKF_AD_RANDOM = 2**32 - 0x1000 + 56  # classic BPF's ancillary load of a random u32 (SKF_AD_OFF + 56)
DROP_CLASS = 0x10020  # classid 1:20, the class whose leaf drops everything
ALL = 2**32


class NetError(RuntimeError):
    """An ``ip`` or ``tc`` command failed (its stderr is in the message)."""


def run(*argv: str, check: bool = True) -> str:
    """Run one command; its stdout.

    Raises:
        NetError: it exited non-zero and ``check`` is set.
    """
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespaces() -> list[str]:
    """The network namespaces of a bench_scale run that exist now (``llms-*``)."""
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines()
            if line.split() and line.split()[0].startswith(PREFIX)]


def kill_inside(ns: str) -> None:
    """SIGKILL every process in namespace ``ns`` (those this benchmark started there; never this one) and
    wait for them."""
    pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).split() if int(p) != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 10.0
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        if pids:
            time.sleep(0.05)  # waiting for the kernel to end them; the event is /proc/PID going away


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a child of this process that exited is reaped here, and any zombie
    counts as gone."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def sweep() -> None:
    """Delete every ``llms-*`` namespace (and the processes in it): what a killed earlier run left."""
    for ns in namespaces():
        kill_inside(ns)
        run("ip", "netns", "del", ns, check=False)


def rand_program(fraction: float) -> str:
    """The classic BPF bytecode (tc's ``bytecode`` syntax) that sends a packet to the drop class with
    probability ``fraction`` and lets the others fall through to the default class."""
    threshold = min(ALL - 1, max(0, round(fraction * ALL)))
    # ld rand; jge threshold -> ret 0 (no match: default class) else ret DROP_CLASS
    return f"4,32 0 0 {SKF_AD_RANDOM},53 1 0 {threshold},6 0 0 {DROP_CLASS},6 0 0 0"


@dataclass
class Lan:
    """The namespaces of one run: ``names`` (each gets ``llms-NAME`` with the address ``SUBNET.i+1``).

    Use as a context manager; :meth:`close` undoes everything and is idempotent.
    """

    names: Sequence[str]
    up: bool = False
    addresses: dict[str, str] = field(default_factory=dict)
    home: int | None = None  # the namespace the thread that called enter() came from (an open fd)

    def ns(self, name: str) -> str:
        """The namespace of node ``name``."""
        return PREFIX + name

    def open(self) -> Lan:
        """Create the switch, the namespaces and the links, with no loss.

        Raises:
            NetError: a command failed (what was made is removed again).
        """
        sweep()
        self.up = True
        try:
            run("ip", "netns", "add", SWITCH)
            run("ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge")
            run("ip", "-n", SWITCH, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns, port, address = self.ns(name), f"p{i}", f"{SUBNET}.{i + 1}"
                run("ip", "netns", "add", ns)
                run("ip", "-n", SWITCH, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                    "netns", ns)
                run("ip", "-n", SWITCH, "link", "set", port, "master", "br0", "up")
                run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
                run("ip", "-n", ns, "link", "set", "eth0", "up")
                run("ip", "-n", ns, "link", "set", "lo", "up")
                run("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
                    "default", "10", "r2q", "100000")
                for cls in ("1:10", "1:20"):
                    run("tc", "-n", ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", cls, "htb",
                        "rate", "10gbit", "burst", "1m", "cburst", "1m")
                run("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "bfifo",
                    "limit", "0")
                self.addresses[name] = address
            self._static_neighbours()
        except BaseException:
            self.close()
            raise
        return self

    def _static_neighbours(self) -> None:
        """Every namespace knows every other node's MAC address for good (``nud permanent``): ARP is not
        what is measured, and with 30+ busy nodes on two cores an ARP exchange failing three times in a
        row left a node unreachable (``EHOSTUNREACH``) for the whole run."""
        macs = {}
        for name in self.names:
            out = run("ip", "-n", self.ns(name), "-o", "link", "show", "eth0")
            macs[name] = out.split("link/ether ", 1)[1].split()[0]
        for name in self.names:
            lines = "".join(f"neigh replace {self.addresses[other]} lladdr {macs[other]} dev eth0 "
                            "nud permanent\n" for other in self.names if other != name)
            subprocess.run(["ip", "-n", self.ns(name), "-batch", "-"], input=lines, text=True, check=True,
                           capture_output=True)

    def __enter__(self) -> Lan:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill what runs in the namespaces and delete them (the links and the bridge go with them)."""
        if not self.up:
            return
        self.up = False
        if self.home is not None:
            setns(self.home)
            os.close(self.home)
            self.home = None
        for name in self.names:
            kill_inside(self.ns(name))
            run("ip", "netns", "del", self.ns(name), check=False)
        run("ip", "netns", "del", SWITCH, check=False)

    def _filter(self, name: str, program: str | None) -> None:
        ns = self.ns(name)
        run("tc", "-n", ns, "filter", "del", "dev", "eth0", "parent", "1:", check=False)
        if program is not None:
            run("tc", "-n", ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "all",
                "prio", "1", "bpf", "bytecode", program)

    def set_loss(self, name: str, fraction: float) -> None:
        """Drop each packet leaving node ``name`` with probability ``fraction`` (0: none)."""
        self._filter(name, rand_program(fraction) if fraction > 0 else None)

    def drop_all(self, name: str) -> None:
        """Drop every packet leaving node ``name`` (undo with :meth:`set_loss` 0)."""
        self._filter(name, f"1,6 0 0 {DROP_CLASS}")

    def link(self, name: str, up: bool) -> None:
        """Set node ``name``'s ``eth0`` up or down."""
        run("ip", "-n", self.ns(name), "link", "set", "eth0", "up" if up else "down")

    def dropped(self, name: str) -> int:
        """Packets node ``name``'s link has dropped so far (the drop class's counter)."""
        out = run("tc", "-n", self.ns(name), "-s", "qdisc", "show", "dev", "eth0")
        for block in out.split("qdisc ")[1:]:
            if block.startswith("bfifo 20:"):
                return int(block.split("dropped ", 1)[1].split(",", 1)[0])
        return 0

    def enter(self, name: str) -> None:
        """Move the calling thread into node ``name``'s namespace (threads it starts afterwards follow it):
        its sockets then reach the others over the simulated LAN. :meth:`close` moves it back.

        Raises:
            OSError: setns(2) failed.
        """
        if self.home is None:
            self.home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.ns(name)}", os.O_RDONLY)
        try:
            setns(fd)
        finally:
            os.close(fd)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open as ``fd``.

    Raises:
        OSError: setns(2) failed.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def link_counters(pid: int, device: str = "eth0") -> tuple[int, int, int, int]:
    """``(rx bytes, rx packets, tx bytes, tx packets)`` of ``device`` in the namespace of process ``pid``
    (read from ``/proc/PID/net/dev``, so no command runs and nothing crosses the link)."""
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f:
            head, _, rest = line.partition(":")
            if head.strip() == device:
                fields = rest.split()
                return int(fields[0]), int(fields[1]), int(fields[8]), int(fields[9])
    return 0, 0, 0, 0
