"""Exceptions of the samplerd client: one per gRPC status code a caller can act on.

Every exception keeps the server's message, which names the offending field and value.
"""

import grpc


class SamplerError(Exception):
    """Base class. `code` is the grpc.StatusCode, `message` the server's (or client's) message.

    Raised as such for codes without a subclass (UNKNOWN, INTERNAL...).
    """

    default_code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code

    def __str__(self):
        return f"{self.code.name}: {self.message}"


class InvalidArgument(SamplerError, ValueError):
    """The request is wrong (bad spec, index out of range, NaN loss, rank outside the world)."""

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SamplerError, KeyError):
    """Unknown job."""

    default_code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(SamplerError):
    """A job with this name exists with another spec."""

    default_code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(SamplerError):
    """Valid request, wrong state (epoch not open, world size mismatch): fix the state first."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(SamplerError):
    """The request's rank claim (incarnation) no longer holds its rank: its ClaimRank call
    ended (a broken connection, a server restart). The clients claim again and retry on their
    own (samplerd.Client with a RankClaim); raised only if that is impossible."""

    default_code = grpc.StatusCode.ABORTED


class ResourceExhausted(SamplerError):
    """A server limit (max jobs, max samples, message size)."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(SamplerError, TimeoutError):
    """The call's deadline passed (e.g. waiting for the next epoch's plan)."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(SamplerError):
    """The server acknowledged less than was sent (a summary's count differs from what the
    client sent): something was not applied although the call ended OK."""

    default_code = grpc.StatusCode.DATA_LOSS


class Unavailable(SamplerError, ConnectionError):
    """The server is down, unreachable or shutting down (after the client's retries)."""

    default_code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(SamplerError, PermissionError):
    """No valid bearer token: the server has --auth_tokens_file and the call sent no token, or
    one it does not know (pass token= or set SAMPLERD_TOKEN; docs/SECURITY.md)."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SamplerError, PermissionError):
    """The token is valid but does not grant this job (the message names it), or the call needs
    an admin token (ListJobs, DeleteJob)."""

    default_code = grpc.StatusCode.PERMISSION_DENIED


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def from_rpc_error(error: grpc.RpcError) -> SamplerError:
    """Maps a grpc.RpcError to the matching SamplerError subclass, keeping the message."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return _BY_CODE.get(code, SamplerError)(details or code.name, code)


class RestartWarning(UserWarning):
    """A restart or shutdown path that changes what is trained without an error: positions
    trained again (a restarted rank that did not load its state) or ended without a loss (an
    epoch ended early, e.g. by close() on the way out of an exception). Turn it into an error
    with warnings.simplefilter("error", samplerd.RestartWarning)."""
