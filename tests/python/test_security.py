"""TLS, mutual TLS and bearer tokens against the real binary, with certificates made by openssl
at test time (tests/make_test_certs.sh). docs/SECURITY.md states the rules checked here."""

import os
import signal
import subprocess
import tempfile
import time

import grpc
import numpy as np
import pytest

import samplerd
from conftest import ROOT, SamplerdProcess, run_samplerd_expecting_failure
from samplerd._proto import samplerd_pb2 as pb

ADMIN = "admin-0123456789abcdef0123456789"
TRAIN = "train-0123456789abcdef0123456789"  # Grants the job "train" only.
NEW = "newer-0123456789abcdef0123456789"  # Not in the file until a reload adds it.
SERVICE = pb.DESCRIPTOR.services_by_name["Sampler"]
ADMIN_ONLY = {"ListJobs", "DeleteJob"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """Directory of NAME.pem / NAME.key made by make_test_certs.sh (ca, server, client, and the
    other_* ones from a CA nobody trusts)."""
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(ROOT / "tests" / "make_test_certs.sh"), str(out)], check=True)
    return out


def tls_args(certs, server="server", client_ca=None):
    args = [f"--tls_cert={certs / (server + '.pem')}", f"--tls_key={certs / (server + '.key')}"]
    if client_ca:
        args.append(f"--tls_client_ca={certs / (client_ca + '.pem')}")
    return args


def write_tokens(path, text, mode=0o600):
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture
def tokens(tmp_path):
    return write_tokens(tmp_path / "tokens", f"# test tokens\n{ADMIN} admin\n{TRAIN} jobs=train\n")


def start(*args, stderr=None):
    return SamplerdProcess(*args, plaintext=False, stderr=stderr)


def client_for(server, certs, client=None, root="ca", **kwargs):
    """A Client of `server` trusting CA `root`, presenting certificate `client` if given; no
    retries, so that a refused handshake fails at once."""
    if client:
        kwargs.update(client_cert=certs / f"{client}.pem", client_key=certs / f"{client}.key")
    return samplerd.Client(server.address, timeout=10, max_retries=0,
                           root_certificates=certs / f"{root}.pem", **kwargs)


@pytest.fixture(autouse=True)
def no_security_environment(monkeypatch):
    for name in ("SAMPLERD_CA", "SAMPLERD_CLIENT_CERT", "SAMPLERD_CLIENT_KEY", "SAMPLERD_TOKEN"):
        monkeypatch.delenv(name, raising=False)


# -- start-up ------------------------------------------------------------------------------------

def test_plaintext_only_when_asked_for_and_bound_to_loopback(certs):
    rc, stderr = run_samplerd_expecting_failure(plaintext=False)
    assert rc != 0
    assert "--tls_cert and --tls_key" in stderr and "--plaintext" in stderr
    server = SamplerdProcess()  # --plaintext
    try:
        assert server.address.startswith("127.0.0.1:")
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("args, want", [
    (lambda c: ["--plaintext", *tls_args(c)], "plaintext = true together with tls_cert"),
    (lambda c: [f"--tls_cert={c / 'server.pem'}"], "tls_cert = \"{c}/server.pem\": given without"),
    (lambda c: [f"--tls_key={c / 'server.key'}"], "tls_key = \"{c}/server.key\": given without"),
    (lambda c: [f"--tls_cert={c}", f"--tls_key={c / 'server.key'}"], "tls_cert = \"{c}\": read"),
    (lambda c: [f"--tls_cert={c / 'nope.pem'}", f"--tls_key={c / 'server.key'}"],
     "tls_cert = \"{c}/nope.pem\": open"),
    (lambda c: [f"--tls_cert={c / 'server.key'}", f"--tls_key={c / 'server.key'}"],
     "tls_cert = \"{c}/server.key\": holds no PEM certificate"),
    (lambda c: [f"--tls_cert={c / 'server.pem'}", f"--tls_key={c / 'client.key'}"],
     "tls_key = \"{c}/client.key\": is not the private key of tls_cert"),
    (lambda c: [*tls_args(c), f"--tls_client_ca={c / 'ca.key'}"],
     "tls_client_ca = \"{c}/ca.key\": holds no PEM certificate"),
])
def test_bad_tls_flags_are_startup_errors_naming_the_flag_and_path(certs, args, want):
    rc, stderr = run_samplerd_expecting_failure(*args(certs), plaintext=False)
    assert rc != 0
    assert want.format(c=certs) in stderr, stderr


def test_a_bad_tokens_file_is_a_startup_error_naming_its_line(tmp_path):
    bad = write_tokens(tmp_path / "tokens", f"{ADMIN} admin\n\n# ok so far\n{TRAIN} jobs=a b\n")
    rc, stderr = run_samplerd_expecting_failure(f"--auth_tokens_file={bad}")
    assert rc != 0
    assert f'auth_tokens_file = "{bad}": {bad}: line 4: expected' in stderr, stderr
    assert TRAIN not in stderr
    rc, stderr = run_samplerd_expecting_failure(f"--auth_tokens_file={tmp_path / 'none'}")
    assert rc != 0 and f'auth_tokens_file = "{tmp_path / "none"}"' in stderr


def test_no_token_reaches_a_message_whatever_the_file_holds(tmp_path):
    """Columns swapped, a token where the grant or a job name goes: the start-up error names the
    line and quotes nothing of it."""
    for line in (f"jobs=train-run-1 {TRAIN}", f"admin {TRAIN}", f"{ADMIN} {TRAIN}",
                 f"{ADMIN} jobs=a,{TRAIN}/x"):
        bad = write_tokens(tmp_path / "tokens", f"# ok\n{NEW} admin\n{line}\n")
        rc, stderr = run_samplerd_expecting_failure(f"--auth_tokens_file={bad}")
        assert rc != 0
        assert f"{bad}: line 3: " in stderr, stderr
        assert TRAIN not in stderr and ADMIN not in stderr and NEW not in stderr, stderr


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_tokens_file_others_may_write_is_refused(tmp_path, mode):
    writable = write_tokens(tmp_path / "tokens", f"{ADMIN} admin\n", mode=mode)
    rc, stderr = run_samplerd_expecting_failure(f"--auth_tokens_file={writable}")
    assert rc != 0
    assert f'auth_tokens_file = "{writable}": writable by' in stderr, stderr
    assert f"(mode {mode:04o})" in stderr and "chmod go-w" in stderr


@pytest.mark.parametrize("cert, problem, dates", [
    ("expired_server", "expired", "not_before=2020-01-01T00:00:00Z not_after=2020-02-01T00:00:00Z"),
    ("future_server", "not_yet_valid",
     "not_before=2099-01-01T00:00:00Z not_after=2099-12-31T00:00:00Z"),
])
def test_a_server_certificate_out_of_its_dates_is_warned_about_and_its_expiry_exported(
        certs, cert, problem, dates):
    import urllib.request
    with tempfile.TemporaryFile("w+") as err:
        server = start(*tls_args(certs, server=cert), "--metrics_port=0", stderr=err)
        try:
            url = server.proc.stdout.readline().split("samplerd metrics on ")[1].strip()
            with urllib.request.urlopen(url, timeout=10) as response:
                metrics = response.read().decode()
        finally:
            assert server.stop() == 0
        err.seek(0)
        log = err.read()
    assert f"event=tls_certificate_not_valid tls_cert={certs / (cert + '.pem')} " \
           f"problem={problem} {dates}" in log, log
    expiry = 1580515200 if problem == "expired" else 4102358400  # not_after, Unix seconds.
    assert f"samplerd_tls_certificate_expiry_timestamp_seconds {expiry}\n" in metrics, metrics


def test_a_world_readable_tokens_file_is_warned_about(tmp_path):
    readable = write_tokens(tmp_path / "tokens", f"{ADMIN} admin\n", mode=0o644)
    with tempfile.TemporaryFile("w+") as err:
        server = SamplerdProcess(f"--auth_tokens_file={readable}", stderr=err)
        assert server.stop() == 0
        err.seek(0)
        assert "is readable by every user" in err.read()


# -- TLS and mutual TLS (the Python client) ------------------------------------------------------

def test_tls_good_and_untrusted_server_certificates(certs):
    server = start(*tls_args(certs))
    try:
        with client_for(server, certs) as c:
            assert c.list_jobs() == []
        # The client trusts another CA than the one that signed the server's certificate.
        with client_for(server, certs, root="other_ca") as c, pytest.raises(samplerd.Unavailable):
            c.list_jobs()
        # A plaintext client on a TLS port.
        with samplerd.Client(server.address, timeout=10, max_retries=0) as c, \
                pytest.raises(samplerd.Unavailable):
            c.list_jobs()
        # The CA given as bytes rather than a path.
        with samplerd.Client(server.address, max_retries=0,
                             root_certificates=(certs / "ca.pem").read_bytes()) as c:
            assert c.list_jobs() == []
    finally:
        assert server.stop() == 0
    impostor = start(*tls_args(certs, server="other_server"))
    try:
        with client_for(impostor, certs) as c, pytest.raises(samplerd.Unavailable):
            c.list_jobs()
    finally:
        assert impostor.stop() == 0


def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(certs):
    server = start(*tls_args(certs, client_ca="ca"))
    try:
        with client_for(server, certs, client="client") as c:
            assert c.list_jobs() == []
        with client_for(server, certs) as c, pytest.raises(samplerd.Unavailable):
            c.list_jobs()  # No client certificate.
        with client_for(server, certs, client="other_client") as c, \
                pytest.raises(samplerd.Unavailable):
            c.list_jobs()  # One from a CA the server does not trust.
    finally:
        assert server.stop() == 0


def test_the_client_takes_its_settings_from_the_environment(certs, tokens, monkeypatch):
    server = start(*tls_args(certs, client_ca="ca"), f"--auth_tokens_file={tokens}")
    try:
        monkeypatch.setenv("SAMPLERD_CA", str(certs / "ca.pem"))
        monkeypatch.setenv("SAMPLERD_CLIENT_CERT", str(certs / "client.pem"))
        monkeypatch.setenv("SAMPLERD_CLIENT_KEY", str(certs / "client.key"))
        monkeypatch.setenv("SAMPLERD_TOKEN", ADMIN)
        with samplerd.Client(server.address, max_retries=0) as c:
            assert c.list_jobs() == []
        # An argument wins over its variable.
        with samplerd.Client(server.address, max_retries=0, token=TRAIN) as c, \
                pytest.raises(samplerd.PermissionDenied, match="ListJobs needs an admin token"):
            c.list_jobs()
    finally:
        assert server.stop() == 0


def test_bad_client_settings_are_named(certs, tmp_path):
    with pytest.raises(samplerd.InvalidArgument, match="client_cert given without client_key"):
        samplerd.Client("127.0.0.1:1", client_cert=certs / "client.pem")
    with pytest.raises(samplerd.InvalidArgument,
                       match=f"root_certificates = '{tmp_path}/none.pem': cannot read it"):
        samplerd.Client("127.0.0.1:1", root_certificates=tmp_path / "none.pem")
    with pytest.raises(samplerd.InvalidArgument, match="client_key = .*: not PEM"):
        samplerd.Client("127.0.0.1:1", client_cert=certs / "client.pem", client_key=b"secret")
    with pytest.raises(samplerd.InvalidArgument, match="tls = False with root_certificates"):
        samplerd.Client("127.0.0.1:1", root_certificates=certs / "ca.pem", tls=False)
    with pytest.raises(samplerd.InvalidArgument, match="token: must be printable") as e:
        samplerd.Client("127.0.0.1:1", token="two words")
    assert "two words" not in str(e.value)


# -- bearer tokens on every RPC ------------------------------------------------------------------

def raw_call(channel, method, job, token):
    """Calls `method` (a MethodDescriptor of samplerd.v1.Sampler) with a request naming `job`
    (empty requests for admin-only calls) and `token`; returns the grpc.StatusCode and details."""
    request_type = getattr(pb, method.input_type.name)
    field = "job" if "job" in request_type.DESCRIPTOR.fields_by_name else "name"
    request = request_type(**({field: job} if method.name not in ADMIN_ONLY else {}))
    path = f"/{SERVICE.full_name}/{method.name}"
    serialize, parse = request_type.SerializeToString, lambda b: b
    metadata = [("authorization", f"Bearer {token}")] if token else None
    if method.client_streaming:
        call = channel.stream_unary if not method.server_streaming else channel.stream_stream
        argument = iter([request])
    else:
        call = channel.unary_unary if not method.server_streaming else channel.unary_stream
        argument = request
    try:
        result = call(path, request_serializer=serialize, response_deserializer=parse)(
            argument, timeout=10, metadata=metadata)
        if method.server_streaming:
            list(result)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


@pytest.fixture
def token_server(certs, tokens):
    server = start(*tls_args(certs), f"--auth_tokens_file={tokens}")
    channel = grpc.secure_channel(server.address, grpc.ssl_channel_credentials(
        (certs / "ca.pem").read_bytes()))
    yield server, channel
    channel.close()
    assert server.stop() == 0


def test_every_rpc_needs_a_token_that_grants_it(token_server):
    server, channel = token_server
    methods = list(SERVICE.methods)
    assert len(methods) >= 10
    for method in methods:
        for token in (None, "unknown-0123456789abcdef0123456789"):
            code, details = raw_call(channel, method, "train", token)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method.name, token, code, details)
            assert "unknown-" not in details
        # The token of job "train" on job "secret": refused, naming the job, never the token.
        code, details = raw_call(channel, method, "secret", TRAIN)
        assert code == grpc.StatusCode.PERMISSION_DENIED, (method.name, code, details)
        assert TRAIN not in details
        if method.name in ADMIN_ONLY:
            assert f"{method.name} needs an admin token" in details
        else:
            assert 'job = "secret"' in details, (method.name, details)
            # Its own job passes the token check (and then fails or not on its own merits).
            code, details = raw_call(channel, method, "train", TRAIN)
            assert code not in (grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.PERMISSION_DENIED), (method.name, details)
        # The admin token passes the token check on any job.
        code, details = raw_call(channel, method, "secret", ADMIN)
        assert code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), (
            method.name, details)


def test_a_job_token_runs_its_job_and_a_loss_stream_cannot_switch_to_another(certs, token_server):
    server, _ = token_server
    with client_for(server, certs, token=TRAIN) as trainer, \
            client_for(server, certs, token=ADMIN) as admin:
        admin.create_job("secret", num_samples=100, world_size=1)
        trainer.create_job("train", num_samples=100, world_size=1, loss="loss")
        shard = trainer.read_shard("train", 0, 0, 1, observe=True)
        assert trainer.report_losses("train", 0, 0, shard[:10], [1.0] * 10,
                                     np.arange(10)).accepted == 10
        with pytest.raises(samplerd.PermissionDenied, match='job = "secret"'):
            trainer.read_shard("secret", 0, 0, 1, observe=True)
        with pytest.raises(samplerd.PermissionDenied, match="DeleteJob needs an admin token"):
            trainer.delete_job("train")
        assert [j.name for j in admin.list_jobs()] == ["secret", "train"]
    # One ReportLosses stream: a batch of its own job, then one of another job.
    channel = grpc.secure_channel(server.address, grpc.ssl_channel_credentials(
        (certs / "ca.pem").read_bytes()))
    try:
        batches = [pb.LossBatch(job="train", epoch=0, rank=0, seq=1, indices=[int(shard[20])],
                                losses=[2.0], positions=[20]),
                   pb.LossBatch(job="secret", epoch=0, rank=0, seq=2, indices=[0], losses=[2.0],
                                positions=[0])]
        report = channel.stream_unary(f"/{SERVICE.full_name}/ReportLosses",
                                      request_serializer=pb.LossBatch.SerializeToString,
                                      response_deserializer=pb.LossReportSummary.FromString)
        with pytest.raises(grpc.RpcError) as e:
            report(iter(batches), timeout=10, metadata=[("authorization", f"Bearer {TRAIN}")])
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert 'batch seq = 2 of rank 0: job = "secret"' in e.value.details()
    finally:
        channel.close()
    with client_for(server, certs, token=ADMIN) as admin:
        assert admin.status("train").ranks[0].losses_accepted == 11  # The first batch counted.


def test_the_docs_name_every_rpc_and_both_refusal_codes():
    """docs/SECURITY.md's access table has a row for every RPC of the .proto (the admin-only
    ones in theirs), and the .proto's error list has the two codes token checks answer."""
    rows = {}
    for line in (ROOT / "docs" / "SECURITY.md").read_text().splitlines():
        if line.startswith("| `") and "|" in line[1:]:
            calls, rule = line[1:].split("|", 1)
            for call in calls.replace("`", "").split(","):
                rows[call.strip()] = rule
    for method in SERVICE.methods:
        assert method.name in rows, f"docs/SECURITY.md's access table lacks {method.name}"
        assert ("admin" in rows[method.name]) == (method.name in ADMIN_ONLY), method.name
    proto = (ROOT / "proto" / "samplerd.proto").read_text()
    errors = proto[proto.index("// Errors (google.rpc code"):]
    for code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        assert f"//   {code} " in errors, code


def test_health_checks_need_no_token(token_server):
    _, channel = token_server
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda service: service,
                                response_deserializer=lambda b: b)
    # HealthCheckRequest{service: ""} is the empty message; HealthCheckResponse{SERVING} is 08 01.
    assert check(b"", timeout=10) == b"\x08\x01"


def test_sighup_reloads_the_tokens_and_a_bad_file_keeps_them(certs, tokens, tmp_path):
    with tempfile.TemporaryFile("w+") as err:
        server = start(*tls_args(certs), f"--auth_tokens_file={tokens}", stderr=err)
        try:
            def code_of(token):
                with client_for(server, certs, token=token) as c:
                    try:
                        c.list_jobs()
                        return grpc.StatusCode.OK
                    except samplerd.SamplerError as e:
                        return e.code

            def reload_until(token, want):
                server.proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + 10
                while code_of(token) != want:
                    assert time.monotonic() < deadline, f"no reload to {want} within 10 s"
                    time.sleep(0.05)

            assert code_of(NEW) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(ADMIN) == grpc.StatusCode.OK
            write_tokens(tokens, f"{NEW} admin\n")  # ADMIN revoked, NEW added.
            reload_until(NEW, grpc.StatusCode.OK)
            assert code_of(ADMIN) == grpc.StatusCode.UNAUTHENTICATED
            # A bad file: logged with its line, and the tokens in use stay. Its columns are
            # swapped: the token is where the grant goes, and is not quoted.
            write_tokens(tokens, f"{ADMIN} admin\njobs=train {NEW}\n")
            server.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "event=reload_tokens result=kept_tokens_in_use" not in (err.seek(0) or
                                                                         err.read()):
                assert time.monotonic() < deadline, "no reload error logged within 10 s"
                time.sleep(0.05)
            err.seek(0)
            log = err.read()
            # The message is a logfmt value: its quotes are escaped.
            assert "line 2: the first field is a grant" in log, log
            assert NEW not in log and ADMIN not in log
            assert code_of(NEW) == grpc.StatusCode.OK
            assert code_of(ADMIN) == grpc.StatusCode.UNAUTHENTICATED
        finally:
            assert server.stop() == 0


def test_the_torch_sampler_passes_client_options_through(certs, token_server):
    torch_sampler = pytest.importorskip("samplerd.torch")
    server, _ = token_server
    with client_for(server, certs, token=TRAIN) as c:
        c.create_job("train", num_samples=64, world_size=1)
    sampler = torch_sampler.DistributedWeightedSampler(
        server.address, "train", rank=0, world_size=1, prefetch=False,
        client_options={"root_certificates": certs / "ca.pem", "token": TRAIN})
    try:
        assert sorted(iter(sampler)) == list(range(64))
    finally:
        sampler.close()
    with client_for(server, certs, token=TRAIN) as c, \
            pytest.raises(samplerd.InvalidArgument, match="client_options: given with a Client"):
        torch_sampler.DistributedWeightedSampler(c, "train", rank=0, world_size=1,
                                                 client_options={"token": TRAIN})


def test_refused_calls_are_logged_with_peer_client_certificate_and_job(certs, tokens):
    """docs/OPERATIONS.md: event=call_refused names the method, code, peer address, the client
    certificate's identity and the job; never the token."""
    with tempfile.TemporaryFile("w+") as err:
        server = start(*tls_args(certs, client_ca="ca"), f"--auth_tokens_file={tokens}",
                       "--log_level=0", stderr=err)
        try:
            with client_for(server, certs, client="client", token=TRAIN) as c:
                with pytest.raises(samplerd.PermissionDenied):
                    c.get_job("secret")
        finally:
            assert server.stop() == 0
        err.seek(0)
        log = err.read()
    lines = [line for line in log.splitlines() if "event=call_refused" in line]
    assert len(lines) == 1, log
    assert "method=/samplerd.v1.Sampler/GetJob code=PERMISSION_DENIED peer=ipv" in lines[0]
    assert 'client="samplerd test client" job=secret' in lines[0], lines[0]
    assert TRAIN not in log


def test_samplerctl_speaks_mutual_tls_and_sends_tokens(certs, tokens):
    """samplerctl's --ca/--cert/--key/--token (and their environment variables) reach the
    server: a job token creates its job, the admin-only list needs the admin token."""
    import subprocess
    import sys
    server = start(*tls_args(certs, client_ca="ca"), f"--auth_tokens_file={tokens}")
    client_dir = ROOT / "client" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLERD_")}
    env["PYTHONPATH"] = str(client_dir)

    def ctl(*args, **extra_env):
        return subprocess.run(
            [sys.executable, "-m", "samplerd.ctl", "--target", server.address, *args],
            capture_output=True, text=True, timeout=30, env=dict(env, **extra_env))

    tls = ["--ca", str(certs / "ca.pem"), "--cert", str(certs / "client.pem"),
           "--key", str(certs / "client.key")]
    try:
        spec_file = tokens.parent / "spec.json"
        spec_file.write_text('{"num_samples": 10, "world_size": 1}')
        created = ctl(*tls, "--token", TRAIN, "create", "train", "--spec", str(spec_file))
        assert created.returncode == 0, created.stderr
        denied = ctl(*tls, "--token", TRAIN, "list")
        assert denied.returncode == 6 and "PERMISSION_DENIED" in denied.stderr
        assert TRAIN not in denied.stderr
        assert ctl(*tls, "list").returncode == 6  # No token: UNAUTHENTICATED.
        listed = ctl("--json", "list", SAMPLERD_CA=str(certs / "ca.pem"),
                     SAMPLERD_CLIENT_CERT=str(certs / "client.pem"),
                     SAMPLERD_CLIENT_KEY=str(certs / "client.key"), SAMPLERD_TOKEN=ADMIN)
        assert listed.returncode == 0, listed.stderr
        assert "train" in listed.stdout
        # Under mutual TLS a client without its certificate is refused at the handshake.
        assert ctl("--ca", str(certs / "ca.pem"), "--token", ADMIN, "list").returncode == 5
    finally:
        assert server.stop() == 0
