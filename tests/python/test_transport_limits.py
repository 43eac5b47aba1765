"""What a connection may cost samplerd before it shows a token: the real binary, spoken to over
raw HTTP/2 (http2_wire.py) where no gRPC library would send the request.

- A 1 MB gzip request that inflates to 1 GiB, with no token: gRPC 1.51 inflated it whole before
  checking its size (+1.1 GB resident, ~4 s of CPU per request). samplerd accepts no compressed
  request (TransportOptions::accept_compressed_requests): it is refused before it is decoded.
- Idle connections are closed: one that sent its preface and settings and then nothing, after
  --max_connection_idle_ms; one that never finished its preface, after --handshake_timeout_ms.
- The server's ping policy accepts the clients' keepalive pings (every 10 s by default): pings
  every 5.5 s, with no call and no data, are not answered with GOAWAY "too_many_pings".
- A large uncompressed request with no token: gRPC 1.51 reads a request whole before any
  handler sees it (whatever --max_message_bytes says), so the handlers' token check came after
  the server had held it (+61 MiB resident for 60 MiB). Over TLS the token is now checked from
  the headers (server/auth/token_metadata_processor.h) and the request is never read; over
  plaintext, what such requests hold together is bounded by --max_transport_buffer_bytes (gRPC's
  resource quota, server/memory_budget.h).
"""

import os
import re
import struct
import time
import urllib.request
import zlib

import grpc
import numpy as np
import pytest

import threading

import samplerd
from conftest import SamplerdProcess
import http2_wire as h2
from test_metrics_prometheus import metrics_url
from test_waiting_ranks import _series
from test_security import certs  # noqa: F401 (a fixture: TLS certificates made by openssl)

TOKEN = "t0k3n-for-the-transport-tests"


def gzip_bomb(size: int = 1 << 30, chunk: int = 1 << 20) -> bytes:
    """A gzip member of `size` zero bytes, ~1 MB long: one compressed chunk repeated (each ends
    with a full flush, so every later one compresses to the same bytes)."""
    zero = bytes(chunk)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // chunk):
        crc = zlib.crc32(zero, crc)
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + first + again * (size // chunk - 1)
            + c.flush() + struct.pack("<II", crc, size & 0xFFFFFFFF))


def usage(pid: int):
    """(CPU seconds, peak resident bytes) of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    return cpu, peak


def port_of(server: SamplerdProcess) -> int:
    return int(server.address.rsplit(":", 1)[1])


def grpc_status(connection: h2.Connection, stream: int):
    """(grpc-status, grpc-message) from the stream's trailers, as literal HPACK fields (how
    gRPC 1.51 sends a status it has not sent before on the connection)."""
    block = b"".join(connection.headers.get(stream, []))
    status = re.search(rb"grpc-status.([0-9]+)", block)
    message = re.search(rb"grpc-message.(.*)", block, re.S)
    return (int(status.group(1)) if status else None,
            message.group(1).decode(errors="replace") if message else "")


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN} admin\n")
    path.chmod(0o600)
    return path


def test_a_gzip_bomb_without_a_token_is_refused_before_it_is_inflated(tokens_file):
    body = h2.grpc_message(gzip_bomb(), compressed=True)
    assert len(body) < 1_100_000
    server = SamplerdProcess(f"--auth_tokens_file={tokens_file}", "--backend=cpu")
    try:
        cpu0, peak0 = usage(server.proc.pid)
        connection = h2.Connection("127.0.0.1", port_of(server))
        connection.send_preface()
        connection.request(1, "/samplerd.v1.Sampler/CreateJob", body,
                           [("grpc-encoding", "gzip")])
        connection.await_end(1, timeout=60)
        code, message = grpc_status(connection, 1)
        connection.close()
        cpu1, peak1 = usage(server.proc.pid)
        print(f"gzip bomb (1 MB -> 1 GiB): status {code} {message!r}; samplerd CPU "
              f"{cpu1 - cpu0:.2f} s, peak resident +{(peak1 - peak0) / 2**20:.1f} MiB")
        assert code == grpc.StatusCode.UNIMPLEMENTED.value[0], message
        assert "'gzip' is disabled" in message
        # Inflated, it costs 1 GiB and seconds of CPU; refused, next to nothing.
        assert peak1 - peak0 < 64 << 20
        assert cpu1 - cpu0 < 1.0
        # The server still serves (and a request with the token works).
        with samplerd.Client(server.address, token=TOKEN, max_retries=0) as client:
            assert client.list_jobs() == []
    finally:
        assert server.stop() == 0


def test_compressed_requests_are_decoded_when_asked_for():
    server = SamplerdProcess("--accept_compressed_requests", "--backend=cpu")
    try:
        with grpc.insecure_channel(server.address, compression=grpc.Compression.Gzip) as channel:
            from samplerd._proto import samplerd_pb2 as pb
            from samplerd._proto import samplerd_pb2_grpc as pb_grpc
            jobs = pb_grpc.SamplerStub(channel).ListJobs(pb.ListJobsRequest(), timeout=20)
            assert list(jobs.jobs) == []
    finally:
        assert server.stop() == 0


def await_closed(connection: h2.Connection, timeout: float) -> float:
    """Reads (and answers) frames until the server closes the connection; returns how long that
    took. Fails the test after `timeout` seconds."""
    start = time.monotonic()
    connection.sock.settimeout(timeout)
    while connection.read_frame() is not None:
        assert time.monotonic() - start < timeout, "the connection is still open"
    return time.monotonic() - start


def test_a_connection_that_only_sent_its_preface_and_settings_is_closed_when_idle():
    server = SamplerdProcess("--max_connection_idle_ms=1000", "--backend=cpu")
    try:
        connections = [h2.Connection("127.0.0.1", port_of(server)) for _ in range(5)]
        for connection in connections:
            connection.send_preface()
        for connection in connections:
            took = await_closed(connection, timeout=30)
            assert connection.goaway is not None, "closed without GOAWAY"
            print(f"idle connection closed after {took:.1f} s (limit 1 s)")
    finally:
        assert server.stop() == 0


def test_a_connection_that_never_finishes_its_preface_is_closed_after_the_handshake_timeout():
    server = SamplerdProcess("--handshake_timeout_ms=1000", "--backend=cpu")
    try:
        connection = h2.Connection("127.0.0.1", port_of(server))
        connection.sock.sendall(h2.PREFACE[:10])  # Half the preface, then nothing.
        # Read without answering (an answer would complete the preface wrongly).
        start = time.monotonic()
        connection.sock.settimeout(30)
        while connection.sock.recv(65536):
            assert time.monotonic() - start < 30, "the connection is still open"
        took = time.monotonic() - start
        assert took >= 0.5, f"closed after {took:.2f} s, before the handshake timeout"
        print(f"half-open connection closed after {took:.1f} s (limit 1 s)")
    finally:
        assert server.stop() == 0


def test_keepalive_pings_as_often_as_the_policy_allows_are_not_ping_abuse():
    server = SamplerdProcess("--backend=cpu")
    try:
        connection = h2.Connection("127.0.0.1", port_of(server))
        connection.send_preface()
        # Every 5.5 s (the server accepts one per 5 s; clients ping every 10 s), no call, no
        # data: gRPC's default policy (one per 5 minutes, two strikes) sent GOAWAY at the third.
        for k in range(4):
            if k:
                time.sleep(5.5)
            connection.sock.sendall(h2.frame(h2.PING, 0, 0, struct.pack(">Q", k)))
            connection.sock.settimeout(10)
            while True:
                got = connection.read_frame()
                assert got is not None, f"the server closed the connection at ping {k}"
                if got[0] == h2.PING and got[1] & h2.ACK and got[3] == struct.pack(">Q", k):
                    break
            # A GOAWAY follows the acknowledgement: read on for a second.
            connection.sock.settimeout(1)
            try:
                while connection.read_frame() is not None:
                    pass
            except TimeoutError:
                pass
            assert connection.goaway is None, f"GOAWAY {connection.goaway!r} at ping {k}"
            assert not connection.closed, f"the server closed the connection at ping {k}"
        connection.close()
    finally:
        assert server.stop() == 0


MIB = 1 << 20


def unauthenticated_requests(server, count, tls_ca=None, size=60 * MIB):
    """`count` connections at once, each sending a CreateJob of `size` bytes (a bytes field of
    that length) without a token; returns each one's (grpc-status, grpc-message, RST_STREAM
    code, whether the server closed the connection) and the server's peak resident growth in
    bytes."""
    body = h2.grpc_message(b"\x0a" + b"\xff\xff\xff\x1d" + bytes(size), compressed=False)
    _, peak0 = usage(server.proc.pid)
    results = []

    def one():
        connection = h2.Connection("localhost" if tls_ca else "127.0.0.1", port_of(server),
                                   tls_ca=tls_ca)
        try:
            connection.send_preface()
            connection.request(1, "/samplerd.v1.Sampler/CreateJob", body)
            connection.await_end(1, timeout=60)
            closed = connection.closed or connection.goaway is not None
            results.append((*grpc_status(connection, 1), connection.rst.get(1), closed))
        except OSError as e:  # The server closed the connection while it was being written.
            results.append((None, repr(e), None, True))
        finally:
            connection.close()
    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _, peak1 = usage(server.proc.pid)
    return results, peak1 - peak0


def test_over_tls_a_request_without_a_token_is_refused_from_its_headers_unread(
        tokens_file, certs):  # noqa: F811
    """8 requests of 60 MiB at once: each is refused UNAUTHENTICATED before its body is read.
    The bound, 8 MiB: a refused stream can push at most its initial flow-control window
    (64 KiB) before the reset, 0.5 MiB for 8, beside 8 TLS connections (~100 KB each) and the
    allocator's slack (measured: +2.1 MiB). Read whole, as before, they held 8 x 61 MiB (or
    what --max_transport_buffer_bytes let them) and were not refused for their token."""
    server = SamplerdProcess(f"--auth_tokens_file={tokens_file}", "--backend=cpu",
                             f"--tls_cert={certs / 'server.pem'}",
                             f"--tls_key={certs / 'server.key'}", "--metrics_port=0",
                             plaintext=False)
    try:
        results, growth = unauthenticated_requests(server, 8, tls_ca=str(certs / "ca.pem"))
        print(f"8 x 60 MiB without a token over TLS: {results[0]}; peak resident "
              f"+{growth / MIB:.1f} MiB")
        for code, message, _, _ in results:
            assert code == grpc.StatusCode.UNAUTHENTICATED.value[0], results
            assert "no bearer token" in message
        assert growth < 8 * MIB
        # Counted, though no interceptor saw them.
        with urllib.request.urlopen(metrics_url(server), timeout=10) as response:
            metrics = response.read().decode()
        assert "samplerd_rpcs_refused_at_headers_total 8" in metrics, metrics[-2000:]
        with samplerd.Client(server.address.replace("127.0.0.1", "localhost"), token=TOKEN,
                             root_certificates=certs / "ca.pem", max_retries=0) as client:
            assert client.list_jobs() == []
    finally:
        assert server.stop() == 0


def test_without_tls_requests_without_a_token_hold_at_most_the_transport_buffers(tokens_file):
    """Plaintext (no processor runs there): 8 requests of 60 MiB at once against
    --max_transport_buffer_bytes = 32 MiB. gRPC resets what does not fit (RST_STREAM
    ENHANCE_YOUR_CALM) or closes the connection; the peak grows by the quota plus what is in
    flight while gRPC reclaims it (measured +40 to +60 MiB in 6 runs; bound: 3 x the quota).
    Before the quota: 8 x 61 MiB."""
    server = SamplerdProcess(f"--auth_tokens_file={tokens_file}", "--backend=cpu",
                             f"--max_transport_buffer_bytes={32 * MIB}")
    try:
        results, growth = unauthenticated_requests(server, 8)
        print(f"8 x 60 MiB without a token over plaintext: {results}; peak resident "
              f"+{growth / MIB:.1f} MiB")
        assert len(results) == 8
        for code, _, rst, closed in results:
            assert code == grpc.StatusCode.UNAUTHENTICATED.value[0] or rst == 11 or closed, \
                results
        assert growth < 96 * MIB
        with samplerd.Client(server.address, token=TOKEN, max_retries=0) as client:
            assert client.list_jobs() == []
    finally:
        assert server.stop() == 0


def test_without_tls_a_streaming_upload_without_a_token_is_refused_within_one_window(
        tokens_file):
    """docs/SECURITY.md's figure for what remains over plaintext: the client-streaming reactors
    refuse at the call's start, but gRPC's transport accepts the stream's data up to the
    initial stream window it announced (gRPC 1.51: just under 4 MiB, not HTTP/2's 64 KiB).
    An 8 MiB UploadWeights without a token: UNAUTHENTICATED after at most that window, the rest
    never sent. The bytes are those the client wrote (DATA frames), not derived from the window
    left: a server that read on would grant more credit and be sent more, as the same upload
    with a token is (read whole, then refused for its content)."""
    server = SamplerdProcess(f"--auth_tokens_file={tokens_file}", "--backend=cpu")
    body = h2.grpc_message(b"\x0a" + b"\x80\x80\x80\x04" + bytes(8 * MIB), compressed=False)

    def upload(*headers):
        connection = h2.Connection("127.0.0.1", port_of(server))
        try:
            connection.send_preface()
            connection.request(1, "/samplerd.v1.Sampler/UploadWeights", body, headers)
            connection.await_end(1, timeout=30)
            return connection.initial_stream_window, connection.sent[1], \
                grpc_status(connection, 1)[0]
        finally:
            connection.close()
    try:
        window, sent, code = upload()
        print(f"initial stream window {window} bytes; sent before the refusal {sent}")
        assert code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert 64 << 10 <= window <= 4 * MIB  # gRPC 1.51's window, as the docs say.
        assert 0 < sent <= window < len(body)
        # The control: with a token the transport reads the whole message (what the reactor
        # then refuses is its content, not the caller).
        _, sent_with_token, code = upload(("authorization", f"Bearer {TOKEN}"))
        print(f"with a token: sent {sent_with_token} of {len(body)}; grpc-status {code}")
        assert sent_with_token == len(body)
        assert code not in (None, grpc.StatusCode.OK.value[0],
                            grpc.StatusCode.UNAUTHENTICATED.value[0])
    finally:
        assert server.stop() == 0


def test_a_shard_stream_reset_by_the_transport_quota_is_retried_within_the_retry_budget():
    """Issue 33: a shard stream that gRPC's transport quota resets (--max_transport_buffer_bytes
    exceeded: RST_STREAM ENHANCE_YOUR_CALM, RESOURCE_EXHAUSTED "Received RST_STREAM with error
    code 11" at the client) is opened again with backoff, not surfaced to the trainer.

    A rank's stream of epoch 1 waits in the server (the other rank has not ended epoch 0) while
    two 16 MiB requests arrive on connections of their own against an 8 MiB quota. gRPC frees
    memory by resetting one stream of a connection per step, the connections in the order they
    first opened a stream (its destructive reclaimers queue first in, first out): the client's
    connection opened one before the requests', so its waiting stream is reset first, then the
    requests. Without retries the reset reaches the caller; with them the stream is opened again,
    waits, and reads its whole shard once the epoch closes. The server's metrics show the reset
    call (CANCELLED at the server) and the retry waiting (measured: 10 of 10 runs reset the
    waiting stream, both times, on a 2-core machine at load average 5 to 8)."""
    server = SamplerdProcess(f"--max_transport_buffer_bytes={8 * MIB}", "--backend=cpu",
                             "--metrics_port=0")
    url = metrics_url(server)
    waiting = 'samplerd_calls_waiting{method="StreamShard"}'
    reset = ('samplerd_rpcs_total{service="samplerd.v1.Sampler",method="StreamShard",'
             'code="CANCELLED"}')

    def read_while_the_quota_is_exceeded(client, expected_resets):
        """Reads rank 0's shard of epoch 1 in a thread; once its stream waits in the server,
        sends the two requests; returns the thread and its outcome (shard or error) once the
        server counted `expected_resets` reset StreamShard calls in all."""
        outcome = {}

        def read():
            try:
                outcome["shard"] = client.read_shard("j", 1, 0, 2)
            except samplerd.SamplerError as e:
                outcome["error"] = e
        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 30
        while _series(url, waiting) < 1:
            assert time.monotonic() < deadline and reader.is_alive(), outcome
            time.sleep(0.01)
        results, _ = unauthenticated_requests(server, 2, size=16 * MIB)
        # Reset (RST_STREAM 11) or closed, or read whole once the quota was freed: load only.
        print(f"2 x 16 MiB against an 8 MiB quota: {results}")
        while _series(url, reset) < expected_resets:
            assert time.monotonic() < deadline, "the waiting shard stream was not reset"
            time.sleep(0.01)
        return reader, outcome

    try:
        with samplerd.Client(server.address, max_retries=0) as impatient:
            impatient.create_job("j", num_samples=1000, world_size=2)
            impatient.end_epoch("j", 0, 0)  # Rank 1 has not: epoch 1 waits for it.
            reader, outcome = read_while_the_quota_is_exceeded(impatient, 1)
            reader.join(timeout=30)
            assert isinstance(outcome.get("error"), samplerd.ResourceExhausted), outcome
            assert "Received RST_STREAM with error code 11" in str(outcome["error"])
        with samplerd.Client(server.address, initial_backoff=0.05, max_backoff=0.2,
                             retry_budget=60) as patient:
            reader, outcome = read_while_the_quota_is_exceeded(patient, 2)
            deadline = time.monotonic() + 30
            while _series(url, waiting) < 1:  # Opened again after the reset, and waiting.
                assert time.monotonic() < deadline and reader.is_alive(), outcome
                time.sleep(0.01)
            patient.end_epoch("j", 0, 1)
            reader.join(timeout=30)
            assert "error" not in outcome, outcome
            shard = outcome["shard"]
            assert len(shard) == 500
            assert np.array_equal(shard, patient.read_shard("j", 1, 0, 2, observe=True))
            other = patient.read_shard("j", 1, 1, 2, observe=True)
            assert np.array_equal(np.sort(np.concatenate([shard, other])), np.arange(1000))
    finally:
        assert server.stop() == 0
