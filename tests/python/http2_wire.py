"""A minimal HTTP/2 client over a plain or TLS socket, for tests that must send what no gRPC client
library sends: a connection that stops after the preface, or a request whose body is a
hand-made gzip message (grpcio compresses only what it serialised itself).

Frames are written and read as RFC 9113 defines them; headers are HPACK literals without
indexing or Huffman coding (RFC 7541 6.2.2), which every decoder must accept. Flow control is
honoured (the peer's WINDOW_UPDATEs are waited for), SETTINGS and PINGs are acknowledged.
"""

import socket
import ssl
import struct
import time
from typing import Dict, List, Optional, Tuple

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
_MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value: nothing larger is sent.


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def _hpack_int(value: int) -> bytes:  # 7-bit prefix, first bit (Huffman) clear.
    if value < 127:
        return bytes([value])
    out, value = bytearray([127]), value - 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literals(headers: List[Tuple[str, str]]) -> bytes:
    block = bytearray()
    for name, value in headers:
        block += b"\x00" + _hpack_int(len(name)) + name.encode() + \
            _hpack_int(len(value)) + value.encode()
    return bytes(block)


class Connection:
    """One HTTP/2 connection to host:port: plaintext with prior knowledge (as gRPC's h2c), or
    TLS with ALPN "h2" trusting the CA file `tls_ca` when given."""

    def __init__(self, host: str, port: int, timeout: float = 30.0,
                 tls_ca: Optional[str] = None):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        if tls_ca is not None:
            context = ssl.create_default_context(cafile=tls_ca)
            context.set_alpn_protocols(["h2"])
            self.sock = context.wrap_socket(self.sock, server_hostname=host)
        self._buffer = b""
        self.send_window = 65535              # The connection's, then each stream's below.
        self.stream_windows: Dict[int, int] = {}
        self.initial_stream_window = 65535
        self.goaway: Optional[bytes] = None
        self.rst: Dict[int, int] = {}
        self.sent: Dict[int, int] = {}        # DATA bytes sent on each stream.
        self.headers: Dict[int, List[bytes]] = {}
        self.closed = False                   # The peer closed the connection.

    def send_preface(self):
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def close(self):
        self.sock.close()

    def read_frame(self) -> Optional[Tuple[int, int, int, bytes]]:
        """The next frame (kind, flags, stream, payload), handling the connection-level ones;
        None once the peer closed the connection (or reset it)."""
        while len(self._buffer) < 9 or len(self._buffer) < 9 + \
                int.from_bytes(self._buffer[:3], "big"):
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return None
            self._buffer += data
        length = int.from_bytes(self._buffer[:3], "big")
        kind, flags = self._buffer[3], self._buffer[4]
        stream = struct.unpack(">I", self._buffer[5:9])[0] & 0x7FFFFFFF
        payload, self._buffer = self._buffer[9:9 + length], self._buffer[9 + length:]
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[i:i + 6])
                if key == 4:  # SETTINGS_INITIAL_WINDOW_SIZE
                    for s in self.stream_windows:
                        self.stream_windows[s] += value - self.initial_stream_window
                    self.initial_stream_window = value
            self.sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.sock.sendall(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += increment
            else:
                self.stream_windows[stream] = self.stream_windows.get(stream, 0) + increment
        elif kind == GOAWAY:
            self.goaway = payload
        elif kind == RST_STREAM:
            self.rst[stream] = struct.unpack(">I", payload)[0]
        elif kind == HEADERS:
            self.headers.setdefault(stream, []).append(payload)
        return kind, flags, stream, payload

    def request(self, stream: int, path: str, body: bytes, extra_headers=()) -> None:
        """Sends a gRPC request (HEADERS, then `body` as DATA frames ending the stream),
        waiting for flow-control credit as needed. Stops early, without error, if the peer
        resets the stream or closes the connection meanwhile (see `rst`, `closed`)."""
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
                   (":authority", "samplerd"), ("content-type", "application/grpc"),
                   ("te", "trailers"), *extra_headers]
        self.stream_windows[stream] = self.initial_stream_window
        self.sock.sendall(frame(HEADERS, END_HEADERS, stream, hpack_literals(headers)))
        offset = 0
        self.sent[stream] = 0
        while offset < len(body):
            if stream in self.rst or self.closed:
                return
            room = min(self.send_window, self.stream_windows[stream], _MAX_FRAME)
            if room <= 0:
                self.read_frame()
                continue
            part = body[offset:offset + room]
            offset += len(part)
            self.send_window -= len(part)
            self.stream_windows[stream] -= len(part)
            self.sent[stream] = offset
            self.sock.sendall(frame(DATA, END_STREAM if offset == len(body) else 0, stream,
                                    part))

    def await_end(self, stream: int, timeout: float) -> None:
        """Reads frames until `stream` got its trailers (END_STREAM on HEADERS) or was reset,
        or the connection closed, or `timeout` seconds passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and stream not in self.rst and not self.closed:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                got = self.read_frame()
            except socket.timeout:
                return
            if got is not None and got[0] == HEADERS and got[2] == stream and got[1] & END_STREAM:
                return


def grpc_message(payload: bytes, compressed: bool) -> bytes:
    """A gRPC length-prefixed message: flag byte, 4-byte big-endian length, payload."""
    return bytes([1 if compressed else 0]) + struct.pack(">I", len(payload)) + payload
