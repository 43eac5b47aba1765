"""samplerd's metrics as a real Prometheus server sees them.

A real samplerd serves --metrics_port=0; Debian's `prometheus` scrapes it every second over
loopback; a small job is driven (create, stream, losses with a duplicate batch and a stale one,
two epochs ended); the values are then read back through Prometheus's HTTP API
(/api/v1/query), as a dashboard or an alert rule would read them. Also checks that every
expression of deploy/grafana/samplerd-dashboard.json names a metric samplerd exports.
"""

import json
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, SamplerdProcess

DASHBOARD = ROOT / "deploy" / "grafana" / "samplerd-dashboard.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def metrics_url(process: SamplerdProcess) -> str:
    """The URL of samplerd's second startup line ("samplerd metrics on URL")."""
    line = process.proc.stdout.readline()
    prefix = "samplerd metrics on "
    assert line.startswith(prefix), f"no metrics line after the listening line: {line!r}"
    return line[len(prefix):].strip()


def exported_names(text: str):
    """Metric family names of a text exposition (# TYPE lines)."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


class Prometheus:
    """Debian's prometheus, scraping `target` (host:port) every second, on a free port."""

    def __init__(self, target: str, workdir: pathlib.Path, credentials_file=None):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("the prometheus binary is missing (tools/install_deps.sh installs the "
                        "Debian package `prometheus`)")
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: samplerd\n"
            + (f"    authorization: {{credentials_file: '{credentials_file}'}}\n"
               if credentials_file else "")
            + "    static_configs:\n"
            f"      - targets: ['{target}']\n")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(workdir / "prometheus.log", "w+")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={self.url[len('http://'):]}",
             # Debian's default points at console files this test does not need.
             "--web.console.templates=/nonexistent", "--web.console.libraries=/nonexistent"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                if "Ready" in http_get(self.url + "/-/ready", timeout=1):
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                pytest.fail(f"prometheus did not become ready:\n{self.log.read()[-3000:]}")
            time.sleep(0.1)

    def query(self, expr: str):
        """Instant query: {frozenset(labels.items()): float value}."""
        body = json.loads(http_get(
            self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        assert body["status"] == "success", body
        return {frozenset(r["metric"].items()): float(r["value"][1])
                for r in body["data"]["result"]}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def test_prometheus_scrapes_the_job_series_with_their_values():
    import samplerd
    # A 4 GiB budget: the stream and transport buffers take a quarter each (issue 22).
    server = SamplerdProcess("--metrics_port=0", f"--max_memory_bytes={4 << 30}")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="samplerd-prometheus-"))
    prometheus = None
    try:
        url = metrics_url(server)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
        prometheus = Prometheus(urllib.parse.urlparse(url).netloc, workdir)
        n, world = 64, 2
        with samplerd.Client(server.address, timeout=20) as client:
            client.create_job("prom", num_samples=n, world_size=world, loss="loss")
            shards = [client.read_shard("prom", 0, rank, world, observe=True) for rank in range(world)]
            streamed = sum(len(shard) for shard in shards)
            for rank, shard in enumerate(shards):
                s = client.report_losses("prom", 0, rank, shard[:10], [0.5] * 10, range(10),
                                         seq=1)
                assert s.accepted == 10
            # Rank 0's batch retried: counted as duplicates, not applied again.
            assert client.report_losses("prom", 0, 0, shards[0][:10], [0.5] * 10, range(10),
                                        seq=1).duplicates == 10
            for rank in range(world):
                client.end_epoch("prom", 0, rank)
            for rank in range(world):
                streamed += len(client.read_shard("prom", 1, rank, world, observe=True))
            # A late batch of epoch 0: stale.
            assert client.report_losses("prom", 0, 1, [1, 2, 3], [1.0] * 3, [0, 1, 2],
                                        seq=2).stale == 3
            for rank in range(world):
                client.end_epoch("prom", 1, rank)
            with pytest.raises(samplerd.NotFound):
                client.get_job("missing")
            # A mixture job: its groups' weights in force (static 3 : 1).
            client.create_job("mix", num_samples=0, world_size=1, samples_per_epoch=16,
                              mixture={"group_sizes": [40, 24], "group_weights": [3.0, 1.0]})
        # A trainer process's claim of its rank, held while Prometheus scrapes.
        holder = samplerd.Client(server.address)
        claim = holder.claim_rank("prom", 1, world)

        job = {("job_name", "prom")}
        sampler = {("service", "samplerd.v1.Sampler")}
        expected = {
            'samplerd_job_epoch{job_name="prom"}': {frozenset(job): 2},
            'samplerd_job_world_size{job_name="prom"}': {frozenset(job): world},
            'samplerd_indices_streamed_total{job_name="prom"}': {frozenset(job): streamed},
            'samplerd_rank_claims{job_name="prom"}': {frozenset(job): 1},
            'samplerd_loss_pairs_total{job_name="prom"}': {
                frozenset(job | {("outcome", "accepted")}): 20,
                frozenset(job | {("outcome", "duplicate")}): 10,
                frozenset(job | {("outcome", "stale")}): 3},
            'samplerd_rpcs_total{method=~"EndEpoch|GetJob|CreateJob"}': {
                frozenset(sampler | {("method", "CreateJob"), ("code", "OK")}): 2,  # prom, mix.
                frozenset(sampler | {("method", "EndEpoch"), ("code", "OK")}): 4,
                frozenset(sampler | {("method", "GetJob"), ("code", "NOT_FOUND")}): 1},
            'samplerd_rpc_duration_seconds_count{method="StreamShard"}': {
                frozenset(sampler | {("method", "StreamShard")}): 4},
            'samplerd_mixture_group_weight{job_name="mix"}': {
                frozenset({("job_name", "mix"), ("group", "0")}): 0.75,
                frozenset({("job_name", "mix"), ("group", "1")}): 0.25},
            "samplerd_jobs": {frozenset(): 2},
            "samplerd_memory_budget_bytes": {frozenset(): 4 << 30},
            "samplerd_memory_reserve_bytes": {frozenset({("use", "stream_buffers")}): 1 << 30,
                                              frozenset({("use", "transport_buffers")}): 1 << 30},
            'samplerd_build_info{version="%s"}' % samplerd.__version__: None,  # Present.
            "sum(samplerd_epoch_plan_seconds_count) >= 3": None,
        }
        # Prometheus's own labels (job="samplerd", instance=...) are dropped for the
        # comparison; metric names (__name__) too. Every series must match, so poll until the
        # scrapes after the last call have arrived.
        deadline = time.monotonic() + 20
        while True:
            got, missing = {}, []
            for expr, want in expected.items():
                result = prometheus.query(expr)
                got[expr] = {frozenset((k, v) for k, v in labels
                                       if k not in ("__name__", "instance")
                                       and not (k == "job" and v == "samplerd")): value
                             for labels, value in result.items()}
                if (want is None and not result) or (want is not None and got[expr] != want):
                    missing.append(expr)
            if not missing:
                break
            if time.monotonic() > deadline:
                pytest.fail("series not as expected in Prometheus after 20 s:\n" + "\n".join(
                    f"  {e}: got {got[e]}, want {expected[e]}" for e in missing))
            time.sleep(0.5)
        # Prometheus saw the target healthy (it parsed every scrape).
        assert prometheus.query('up{job="samplerd"}') == {
            frozenset({("job", "samplerd"), ("instance", urllib.parse.urlparse(url).netloc),
                       ("__name__", "up")}): 1}
        holder.close()
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert server.stop() == 0
        shutil.rmtree(workdir, ignore_errors=True)


def test_metrics_beyond_loopback_need_the_token_prometheus_sends(tmp_path):
    """docs/OPERATIONS.md's model: the metrics name every job, so a --metrics_host other than
    loopback needs --metrics_token_file; the real Prometheus scrapes with the same file
    (authorization.credentials_file), a request without it gets 401 and no job name."""
    import urllib.error
    import samplerd
    from conftest import run_samplerd_expecting_failure
    rc, stderr = run_samplerd_expecting_failure("--metrics_port=0", "--metrics_host=0.0.0.0")
    assert rc != 0 and 'metrics_host = "0.0.0.0" is not loopback' in stderr, stderr
    token_file = tmp_path / "metrics-token"
    token_file.write_text("metrics-0123456789abcdef0123456789\n")
    token_file.chmod(0o600)
    server = SamplerdProcess("--metrics_port=0", "--metrics_host=0.0.0.0",
                             f"--metrics_token_file={token_file}")
    prometheus = None
    try:
        url = metrics_url(server)
        port = urllib.parse.urlparse(url).port
        assert url == f"http://0.0.0.0:{port}/metrics"
        with samplerd.Client(server.address, timeout=20) as client:
            client.create_job("secret-run", num_samples=8, world_size=1)
        for headers in ({}, {"Authorization": "Bearer wrong-0123456789abcdef"}):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{port}/metrics", headers=headers), timeout=5)
            assert e.value.code == 401
            assert "secret-run" not in e.value.read().decode()
        prometheus = Prometheus(f"127.0.0.1:{port}", tmp_path, credentials_file=token_file)
        deadline = time.monotonic() + 20
        while not prometheus.query('samplerd_job_epoch{job_name="secret-run"}'):
            assert time.monotonic() < deadline, "Prometheus got no job series with the token"
            time.sleep(0.5)
        assert list(prometheus.query('up{job="samplerd"}').values()) == [1]
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert server.stop() == 0


def test_dashboard_uses_only_exported_series():
    import samplerd
    server = SamplerdProcess("--metrics_port=0")
    try:
        url = metrics_url(server)
        # Labelled families appear with their first series: use every kind of call once.
        with samplerd.Client(server.address, timeout=20) as client:
            client.create_job("d", num_samples=8, world_size=1, loss="loss")
            shard = client.read_shard("d", 0, 0, 1, observe=True)
            client.report_losses("d", 0, 0, shard[:2], [1.0, 2.0], [0, 1], seq=1)
            client.end_epoch("d", 0, 0)
        text = http_get(url)
    finally:
        assert server.stop() == 0
    names = exported_names(text)
    # A histogram's series are its name plus _bucket, _sum, _count.
    series = set(names) | {f"{n}{s}" for n in names for s in ("_bucket", "_sum", "_count")}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    used = set()
    for expr in exprs:
        for name in re.findall(r"\b(samplerd_[a-z_]+)", expr):
            assert name in series, f"dashboard query {expr!r} names {name}, not exported " \
                                   f"by samplerd (exported: {sorted(names)})"
            used.add(name)
    # Every family samplerd exports has a panel (the dashboard is its documentation too).
    unused = {n for n in names if not any(u == n or u.startswith(n + "_") for u in used)}
    assert not unused, f"exported but on no dashboard panel: {sorted(unused)}"
