"""A typed client for samplerd (proto/samplerd.proto, service samplerd.v1.Sampler).

Every call has a deadline; UNAVAILABLE is retried with exponential backoff; gRPC errors become
`samplerd.errors` exceptions that keep the server's message. Arguments are checked at the call
site, so a wrong shape or a NaN loss raises where the caller made the mistake. The summaries of
client streams are checked against what was sent (DataLoss on a mismatch). The API's limits
(batch size, chunk size) come from the .proto (samplerd_pb2.MAX_LOSS_BATCH_PAIRS, ...).

Client is the composition of its parts, one concern each: _client_connection (the channel, _call
with its retries (_client_retries), close, claim_rank), _client_claims (RankClaim), _client_jobs
(job administration, health), _client_uploads (weights, labels), _client_shards (stream_shard,
ShardChunk), _client_losses (loss reports, end_epoch); _client_policy (Policy, the enum names) and
_client_checks (the argument checks, loss_batch_message). Every public name is imported from here.
"""

from ._client_checks import check_loss_batch, check_positions, loss_batch_message
from ._client_claims import RankClaim
from ._client_jobs import _Jobs
from ._client_losses import _Losses
from ._client_policy import Policy
from ._client_shards import ShardChunk, _Shards
from ._client_uploads import _Uploads

__all__ = ["Client", "Policy", "RankClaim", "ShardChunk", "check_loss_batch", "check_positions",
           "loss_batch_message"]


class Client(_Jobs, _Uploads, _Shards, _Losses):
    """Client of one samplerd server.

    Args:
        address: "host:port" of samplerd.
        timeout: deadline in seconds of each call; for stream_shard, of each wait for data.
        retry_budget: seconds a call is retried on UNAVAILABLE (and on CANCELLED the client did
            not cause by close(): a server shutting down) with exponential backoff, counted
            from its first failure (for stream_shard, from the last chunk received): a retry
            that would start later is not made, and the error is raised. The default, 300 s
            (samplerd_pb2.DEFAULT_RETRY_BUDGET_MS), covers a samplerd restarted by its
            supervisor (deploy/systemd: 5 s after a crash) or rescheduled on another node with
            its volume (a Kubernetes StatefulSet pod; docs/OPERATIONS.md "Losing samplerd's
            node"). A tool that should fail fast passes less, or max_retries.
        max_retries: most retries after the first attempt (for stream_shard, in a row without
            a chunk received), within retry_budget; None: no limit but the budget.
        keepalive_time, keepalive_timeout: seconds. The client pings its connection every
            keepalive_time (also with no call in flight) and drops it when a ping is not
            acknowledged within keepalive_timeout -- a flow a NAT, load balancer or switch
            forgot without a reset -- so its calls fail with UNAVAILABLE and are retried on a
            new connection (a shard stream at its position). The server accepts pings every
            --min_client_ping_interval_ms (5 s): keepalive_time must not be shorter.
        initial_backoff: first backoff in seconds; doubles up to max_backoff.
        max_backoff: largest backoff in seconds.
        max_message_bytes: largest gRPC message either way (the server has its own limit).
        root_certificates: PEM of the CA(s) that signed the server's certificate: a path, or
            the bytes. Default: $SAMPLERD_CA.
        client_cert, client_key: the client's PEM certificate and private key (paths or bytes),
            for a server that requires mutual TLS. Default: $SAMPLERD_CLIENT_CERT and
            $SAMPLERD_CLIENT_KEY.
        token: bearer token, sent with every call (`authorization: Bearer <token>`).
            Default: $SAMPLERD_TOKEN.
        tls: True for TLS, False for plaintext; None (default): TLS if any of the three PEM
            settings is given, else plaintext. See docs/SECURITY.md.

    Raises:
        InvalidArgument: a malformed address, a negative max_retries or retry_budget, a
            keepalive time or timeout <= 0; a PEM file that cannot be read, client_cert without
            client_key, a token with spaces.

    Use as a context manager to close the channel. Safe to share between threads; not
    picklable (create one per process).
    """
