"""The channel of a Client: TLS or mutual TLS, and a bearer token (docs/SECURITY.md).

Every setting not given as an argument is taken from the environment, so that a trainer's
launcher can configure all its clients at once:

    SAMPLERD_CA           path of the PEM file of the CA(s) that signed the server's certificate
    SAMPLERD_CLIENT_CERT  path of the client's PEM certificate (mutual TLS)
    SAMPLERD_CLIENT_KEY   path of its PEM private key
    SAMPLERD_TOKEN        the bearer token (sent as "authorization: Bearer <token>")
"""

import collections
import os
from typing import Optional, Sequence, Tuple, Union

import grpc

from . import errors

# A PEM file's path, or its contents.
Pem = Union[str, bytes, os.PathLike]

ENV = {
    "root_certificates": "SAMPLERD_CA",
    "client_cert": "SAMPLERD_CLIENT_CERT",
    "client_key": "SAMPLERD_CLIENT_KEY",
    "token": "SAMPLERD_TOKEN",
}


def _bad(message):
    return errors.InvalidArgument(message)


def _from_env(name, value):
    """`value`, or the environment variable of `name` when `value` is None ("" counts as unset)."""
    if value is not None:
        return value
    return os.environ.get(ENV[name]) or None


def _read_pem(name: str, value: Pem) -> bytes:
    """The PEM bytes of argument `name`: `value` itself if bytes, else the file it names."""
    if isinstance(value, bytes):
        data, where = value, "the bytes given"
    else:
        where = os.fspath(value)
        try:
            with open(where, "rb") as f:
                data = f.read()
        except OSError as e:
            raise _bad(f"{name} = {where!r}: cannot read it: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise _bad(f"{name} = {where!r}: not PEM (no '-----BEGIN ' line)")
    return data


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call's metadata. An interceptor rather than gRPC's call
    credentials: those are refused on plaintext channels, and a token on a loopback plaintext
    server is a legitimate setup (the server warns when it is not on loopback)."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        return _CallDetails(details.method, details.timeout,
                            [*(details.metadata or ()), self._header], details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


def open_channel(address: str, options: Sequence[Tuple[str, object]], *,
                 root_certificates: Optional[Pem] = None, client_cert: Optional[Pem] = None,
                 client_key: Optional[Pem] = None, token: Optional[str] = None,
                 tls: Optional[bool] = None) -> grpc.Channel:
    """A channel to `address` with `options`, secured as the arguments (or environment) say.

    TLS is used when `tls` is True, or when it is None and any of the three PEM settings is
    given; with TLS and no root_certificates, gRPC's default roots verify the server.

    Raises:
        InvalidArgument: a PEM file that cannot be read or is not PEM, client_cert without
            client_key (or the reverse), certificates with tls=False, or a token that cannot
            travel in a header (the message never contains the token).
    """
    root_certificates = _from_env("root_certificates", root_certificates)
    client_cert = _from_env("client_cert", client_cert)
    client_key = _from_env("client_key", client_key)
    token = _from_env("token", token)
    if token is not None and (not token or any(not "\x21" <= c <= "\x7e" for c in token)):
        raise _bad("token: must be printable ASCII without spaces (as in --auth_tokens_file)")
    if (client_cert is None) != (client_key is None):
        given, missing = ("client_cert", "client_key") if client_key is None else (
            "client_key", "client_cert")
        raise _bad(f"{given} given without {missing} (or ${ENV[missing]}): mutual TLS needs both")
    any_pem = any(v is not None for v in (root_certificates, client_cert, client_key))
    if tls is False and any_pem:
        raise _bad("tls = False with root_certificates/client_cert/client_key (or their "
                   "environment variables): drop them or use TLS")
    if tls or (tls is None and any_pem):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(None if root_certificates is None
                               else _read_pem("root_certificates", root_certificates)),
            private_key=None if client_key is None else _read_pem("client_key", client_key),
            certificate_chain=None if client_cert is None else _read_pem("client_cert",
                                                                         client_cert))
        channel = grpc.secure_channel(address, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    if token is None:
        return channel
    return grpc.intercept_channel(channel, _BearerToken(token))
