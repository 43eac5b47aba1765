"""The Kubernetes manifests (deploy/k8s): schema-valid and consistent with what samplerd needs.

kubernetes-validate (PyPI, installed by tools/install_deps.sh) checks every object against the
Kubernetes API schemas it ships, in strict mode (an unknown or misspelt field fails). Schemas
cannot see references between objects or samplerd's own needs, so `problems` below checks
those: claims, Services and addresses that exist; TLS or an explicit --plaintext; probes on the
port served, asking for the sampler service; a grace period above --grace_period_ms; a state
directory on a PersistentVolumeClaim; a non-root, read-only container; the sidecar form as a
native sidecar. Each rule is shown to fail on a manifest that breaks it.
"""

import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

K8S = ROOT / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
# 1.29: the oldest release with native sidecars (initContainer restartPolicy) on by default;
# 1.33: where they are GA. Both ship with the pinned kubernetes-validate.
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0")
# The central form claims Kubernetes >= 1.25 (deploy/README.md): 1.25 is the oldest release the
# pinned kubernetes-validate has schemas of.
CENTRAL_FORM_OLDEST = "1.25.0"
VALIDATE = pathlib.Path(sys.executable).parent / "kubernetes-validate"
HEALTH_SERVICE = "samplerd.v1.Sampler"


def validate(paths, version):
    if not VALIDATE.exists():
        pytest.fail(f"{VALIDATE} missing: run tools/install_deps.sh")
    return subprocess.run([str(VALIDATE), "--strict", "--quiet", "-k", version,
                           *map(str, paths)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_schema_valid_in_strict_mode(version):
    assert len(MANIFESTS) >= 2
    result = validate(MANIFESTS, version)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_central_form_is_schema_valid_for_the_oldest_release_it_claims():
    result = validate([K8S / "samplerd.yaml"], CENTRAL_FORM_OLDEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Kubernetes >= {CENTRAL_FORM_OLDEST[:-2]}" in (ROOT / "deploy" / "README.md").read_text()


def test_strict_validation_rejects_a_misspelt_field(tmp_path):
    broken = tmp_path / "typo.yaml"
    text = (K8S / "trainer-sidecar.yaml").read_text()
    broken.write_text(text.replace("\n          restartPolicy: Always\n",
                                   "\n          restartPolicyy: Always\n", 1))
    result = validate([broken], KUBERNETES_VERSIONS[-1])
    assert result.returncode != 0
    assert "restartPolicyy" in result.stdout + result.stderr


def flag(args, name):
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def pod_specs(objects):
    """(owner kind, owner, pod spec) of every object that runs pods."""
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] in ("StatefulSet", "Deployment", "Job"):
            yield obj["kind"], obj, spec["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield "Pod", obj, spec


def problems(objects):
    """Everything that would keep the manifests from working the first time, as sentences."""
    found = []
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    templates = [o["spec"]["template"]["metadata"].get("labels", {}) for o in objects
                 if "template" in o.get("spec", {})]
    for obj in objects:
        name = f'{obj["kind"]} {obj["metadata"]["name"]}'
        if obj["kind"] == "StatefulSet" and obj["spec"]["serviceName"] not in services:
            found.append(f"{name}: serviceName {obj['spec']['serviceName']} is no Service")
        if obj["kind"] == "Service":
            selector = obj["spec"].get("selector", {})
            if not any(selector.items() <= labels.items() for labels in templates):
                found.append(f"{name}: selector {selector} matches no pod template")
    for kind, owner, pod in pod_specs(objects):
        name = f'{kind} {owner["metadata"]["name"]}'
        own_claims = claims | {t["metadata"]["name"]
                               for t in owner["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for volume in volumes.values():
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim not in own_claims:
                found.append(f"{name}: claim {claim} is defined by no manifest")
        inits, containers = pod.get("initContainers", []), pod.get("containers", [])
        for container in inits + containers:
            for env in container.get("env", []):
                if env["name"] == "SAMPLERD_ADDRESS":
                    host = env["value"].rsplit(":", 1)[0].split(".")[0]
                    if env["value"].split(":")[0] != "127.0.0.1" and host not in services:
                        found.append(f"{name}: SAMPLERD_ADDRESS {env['value']} names no Service")
        for container in inits + containers:
            if not container["image"].startswith("samplerd:"):
                continue
            cname = f"{name} container {container['name']}"
            args = container.get("args", [])
            if "--plaintext" not in args and not (flag(args, "tls_cert") and
                                                  flag(args, "tls_key")):
                found.append(f"{cname}: neither --tls_cert/--tls_key nor --plaintext")
            if flag(args, "host") is None:
                found.append(f"{cname}: no explicit --host (the default is 127.0.0.1)")
            port = int(flag(args, "port") or 50051)
            for probe in ("startupProbe", "livenessProbe"):
                grpc = container.get(probe, {}).get("grpc")
                if grpc != {"port": port, "service": HEALTH_SERVICE}:
                    found.append(f"{cname}: {probe} is not a gRPC probe of {HEALTH_SERVICE} on "
                                 f"port {port}: {container.get(probe)}")
            grace_s = int(flag(args, "grace_period_ms") or 10000) / 1000
            termination = pod.get("terminationGracePeriodSeconds", 30)
            if not grace_s < termination <= grace_s + 60:
                found.append(f"{cname}: terminationGracePeriodSeconds {termination} does not "
                             f"leave a margin above --grace_period_ms ({grace_s} s)")
            data_dir = flag(args, "data_dir")
            mount = next((m for m in container.get("volumeMounts", [])
                          if m["mountPath"] == data_dir), None)
            source = volumes.get(mount["name"], {}) if mount else {}
            if "persistentVolumeClaim" not in source and not any(
                    t["metadata"]["name"] == (mount or {}).get("name")
                    for t in owner["spec"].get("volumeClaimTemplates", [])):
                found.append(f"{cname}: --data_dir={data_dir} is not on a PersistentVolumeClaim")
            security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            for field, want in (("runAsNonRoot", True), ("readOnlyRootFilesystem", True),
                                ("allowPrivilegeEscalation", False)):
                if security.get(field) != want:
                    found.append(f"{cname}: securityContext {field} is not {want}")
            if "fsGroup" not in pod.get("securityContext", {}):
                found.append(f"{name}: no fsGroup: the volume is not writable by samplerd's uid")
            metrics_host = flag(args, "metrics_host") or "127.0.0.1"
            if flag(args, "metrics_port") and not metrics_host.startswith("127."):
                # The metrics name every job (docs/OPERATIONS.md): samplerd refuses to start.
                token = flag(args, "metrics_token_file")
                mounted = token and any(
                    token.startswith(m["mountPath"] + "/") and "secret" in volumes.get(
                        m["name"], {}) for m in container.get("volumeMounts", []))
                if not mounted:
                    found.append(f"{cname}: metrics on {metrics_host} without a "
                                 "--metrics_token_file from a mounted Secret")
                metrics_port = int(flag(args, "metrics_port"))
                for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
                    for rule in policy["spec"].get("ingress", []):
                        if "from" not in rule and any(p.get("port") == metrics_port
                                                      for p in rule.get("ports", [])):
                            found.append(f"NetworkPolicy {policy['metadata']['name']}: metrics "
                                         f"port {metrics_port} open to every pod")
            if "limits" not in container.get("resources", {}):
                found.append(f"{cname}: no resource limits")
            if kind == "Job" and (container not in inits
                                  or container.get("restartPolicy") != "Always"):
                found.append(f"{cname}: in a Job, samplerd must be a native sidecar (an "
                             "initContainer with restartPolicy: Always), or the pod never ends")
            if kind != "Job" and "readinessProbe" not in container:
                found.append(f"{cname}: no readinessProbe")
    return found


def load(*paths):
    return [o for p in paths for o in yaml.safe_load_all(pathlib.Path(p).read_text()) if o]


def test_manifests_have_what_samplerd_needs():
    objects = load(*MANIFESTS)
    assert {o["kind"] for o in objects} >= {"StatefulSet", "Service", "Job",
                                            "PersistentVolumeClaim"}
    assert problems(objects) == []


def edited(path, old, new):
    """The manifest with the first line whose content (after its indentation) is `old`
    replaced by `new` at the same indentation, or removed when `new` is None."""
    lines = (K8S / path).read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() == old:
            indent = line[:len(line) - len(line.lstrip())]
            lines[i] = "" if new is None else f"{indent}{new}\n"
            return [o for o in yaml.safe_load_all("".join(lines)) if o]
    raise AssertionError(f"no line {old!r} in {path}")


@pytest.mark.parametrize("path,old,new,expected", [
    ("samplerd.yaml", "- --plaintext", None, "neither --tls_cert/--tls_key nor --plaintext"),
    ("samplerd.yaml", "- --host=0.0.0.0", None, "no explicit --host"),
    ("samplerd.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30",
     "terminationGracePeriodSeconds 30 does not leave a margin"),
    ("samplerd.yaml", "serviceName: samplerd", "serviceName: samplerd-headless",
     "serviceName samplerd-headless is no Service"),
    ("samplerd.yaml", "grpc: {port: 50051, service: samplerd.v1.Sampler}",
     "grpc: {port: 50051}", "startupProbe is not a gRPC probe"),
    ("samplerd.yaml", "fsGroup: 65534", "supplementalGroups: [65534]", "no fsGroup"),
    ("samplerd.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false",
     "readOnlyRootFilesystem is not True"),
    ("samplerd.yaml", "- --metrics_token_file=/etc/samplerd/metrics/token", None,
     "metrics on 0.0.0.0 without a --metrics_token_file"),
    ("samplerd.yaml", "secret: {secretName: samplerd-metrics-token, defaultMode: 0400}",
     "emptyDir: {}", "without a --metrics_token_file from a mounted Secret"),
    ("samplerd.yaml",
     "- from: [{namespaceSelector: {}, podSelector: {matchLabels: {app.kubernetes.io/name: "
     "prometheus}}}]", "- ports: [{port: 9090, protocol: TCP}]",
     "metrics port 9090 open to every pod"),
    ("samplerd.yaml", "selector: {app.kubernetes.io/name: samplerd}",
     "selector: {app: samplerd}", "matches no pod template"),
    ("trainer-sidecar.yaml", "persistentVolumeClaim: {claimName: train-run-1-samplerd-state}",
     "persistentVolumeClaim: {claimName: samplerd-state}",
     "claim samplerd-state is defined by no manifest"),
    ("trainer-sidecar.yaml", "persistentVolumeClaim: {claimName: train-run-1-samplerd-state}",
     "emptyDir: {}", "is not on a PersistentVolumeClaim"),
    ("trainer-sidecar.yaml", "restartPolicy: Always", None, "must be a native sidecar"),
    ("trainer-sidecar.yaml", '- {name: SAMPLERD_ADDRESS, value: "127.0.0.1:50051"}',
     '- {name: SAMPLERD_ADDRESS, value: "samplerd-headless:50051"}', "names no Service"),
])
def test_each_rule_fails_on_a_manifest_that_breaks_it(path, old, new, expected):
    other = [p for p in MANIFESTS if p.name != path]
    found = problems(edited(path, old, new) + load(*other))
    assert any(expected in p for p in found), found
