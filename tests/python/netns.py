"""Network namespaces for tests of real network paths: "nodes" (one network namespace each)
joined by a switch (a bridge in a namespace of its own), each with an address of its own, so
that samplerd, a load balancer and the trainer ranks talk over veth links that a test can cut
without a reset (the switch-side end taken down: packets are dropped, nobody is told).

Needs root (CAP_NET_ADMIN) and iproute2's `ip`: Network() skips the test, saying why, otherwise. Names are unique per process and test, and everything is deleted on exit.
"""

import itertools
import os
import shutil
import subprocess
from typing import Dict, List

import pytest

_counter = itertools.count()


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def skip_unless_possible():
    """Skips the calling test, saying why, where network namespaces cannot be made."""
    if shutil.which("ip") is None:
        pytest.skip("network-namespace test: iproute2's `ip` is not installed "
                    "(apt-get install iproute2)")
    if os.geteuid() != 0:
        pytest.skip("network-namespace test: needs root (CAP_NET_ADMIN) for `ip netns add`")
    probe = f"sdprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.skip(f"network-namespace test: `ip netns add` failed: {made.stderr.strip()}")
    _ip("netns", "delete", probe, check=False)


class Network:
    """Nodes named by the caller, each a namespace with one address on a common /24 behind a
    switch. Use as a context manager: the namespaces (and so their links) are deleted on exit.
    Stop the processes started in them first."""

    def __init__(self, nodes: List[str]):
        skip_unless_possible()
        tag = f"sd{os.getpid() % 100000}{next(_counter)}"
        self._tag = tag
        self.switch = f"{tag}-sw"
        self.namespaces: Dict[str, str] = {}
        self.addresses: Dict[str, str] = {}
        self._ports: Dict[str, str] = {}  # node -> its link's switch-side end.
        self._made: List[str] = []
        try:
            self._add(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for k, node in enumerate(nodes):
                ns = f"{tag}-{node}"
                self._add(ns)
                inner, outer = f"{tag}{k}i", f"{tag}{k}o"  # Interface names: <= 15 bytes.
                _ip("link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer,
                    "netns", self.switch)
                _ip("-n", self.switch, "link", "set", outer, "master", "br0")
                _ip("-n", self.switch, "link", "set", outer, "up")
                address = f"10.77.0.{k + 1}"
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.namespaces[node] = ns
                self.addresses[node] = address
                self._ports[node] = outer
        except BaseException:
            self.delete()
            raise

    def _add(self, ns):
        _ip("netns", "add", ns)
        self._made.append(ns)

    def command(self, node: str, argv: List[str]) -> List[str]:
        """`argv` run inside `node`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def cut(self, node: str):
        """Takes `node`'s link down at the switch: its packets, both ways, are dropped from now
        on, and no endpoint is told (no reset, no ICMP)."""
        _ip("-n", self.switch, "link", "set", self._ports[node], "down")

    def heal(self, node: str):
        _ip("-n", self.switch, "link", "set", self._ports[node], "up")

    def delete(self):
        for ns in reversed(self._made):
            _ip("netns", "delete", ns, check=False)
        self._made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.delete()
