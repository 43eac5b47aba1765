"""A TCP proxy standing for a Kubernetes Service (or a cloud L4 load balancer) in the network
tests: clients dial its stable address; each new connection is forwarded to the backend named
in --backend_file at that moment (the test rewrites it when samplerd comes back on another
node, as the endpoints controller does once the new pod is ready).

SIGUSR1 freezes every connection open at that moment: from then on nothing more is relayed
either way and nothing is closed -- a flow a NAT or load balancer forgot without a reset --
while new connections are forwarded normally.

Prints "proxy listening on HOST:PORT" once listening. Runs until killed.

    python tcp_proxy.py --listen 10.77.0.4:0 --backend_file /tmp/backend
"""

import argparse
import selectors
import signal
import socket
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True, help="HOST:PORT (PORT 0: a free one)")
    parser.add_argument("--backend_file", required=True, help="file holding HOST:PORT")
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    listener = socket.create_server((host, int(port)))
    listener.setblocking(False)
    print(f"proxy listening on {host}:{listener.getsockname()[1]}", flush=True)

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    peers = {}      # socket -> the socket it relays to.
    out = {}        # socket -> bytes read from its peer, not yet written to it.
    frozen = set()  # Sockets of frozen flows: kept open, never read or written again.
    limit = 1 << 20  # A socket is not read while its peer has this much unwritten.

    def watch(s):
        """(Re)registers what `s` waits for: reading while its peer's backlog is short,
        writing while its own backlog is not empty. Never blocks: a dead peer (a lost node)
        stalls its own flow only, as in a real load balancer."""
        if s not in peers or s in frozen:
            return
        events = (selectors.EVENT_READ if len(out[peers[s]]) < limit else 0) | \
            (selectors.EVENT_WRITE if out[s] else 0)
        registered = s in selector.get_map()
        if events and registered:
            selector.modify(s, events)
        elif events:
            selector.register(s, events)
        elif registered:
            selector.unregister(s)

    def freeze(*_):
        for s in list(peers):
            if s not in frozen:
                frozen.add(s)
                if s in selector.get_map():
                    selector.unregister(s)
    signal.signal(signal.SIGUSR1, freeze)

    def close(s):
        for end in (s, peers.get(s)):
            if end is None or end not in peers:
                continue
            if end in selector.get_map():
                selector.unregister(end)
            peers.pop(end)
            out.pop(end)
            end.close()

    while True:
        try:
            events = selector.select()
        except InterruptedError:
            continue
        for key, mask in events:
            s = key.fileobj
            if s is listener:
                try:
                    client, _ = listener.accept()
                except BlockingIOError:
                    continue
                with open(args.backend_file) as f:
                    backend_host, backend_port = f.read().strip().rsplit(":", 1)
                try:
                    upstream = socket.create_connection((backend_host, int(backend_port)),
                                                        timeout=2)
                except OSError as e:
                    print(f"proxy: backend {backend_host}:{backend_port}: {e}", file=sys.stderr,
                          flush=True)
                    client.close()  # As a Service with no ready endpoint: refused.
                    continue
                for end, other in ((client, upstream), (upstream, client)):
                    end.setblocking(False)
                    peers[end], out[end] = other, bytearray()
                watch(client)
                watch(upstream)
                continue
            if s not in peers or s in frozen:
                continue
            if mask & selectors.EVENT_WRITE:
                try:
                    sent = s.send(out[s])
                except BlockingIOError:
                    sent = 0
                except OSError:
                    close(s)
                    continue
                del out[s][:sent]
                watch(s)
                watch(peers[s])
            if mask & selectors.EVENT_READ:
                try:
                    data = s.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    close(s)
                    continue
                other = peers[s]
                if other not in frozen:
                    out[other] += data
                    watch(other)
                watch(s)


if __name__ == "__main__":
    main()
