#!/usr/bin/env python3
"""Checks kiln's Kubernetes manifests (deploy/kubernetes) without a cluster: that each YAML
document parses and is a kind this set uses, at its apiVersion; that selectors select the
labels of the pods they mean; that every Secret, ConfigMap, Service, volume and port a manifest
names is in the set; that kilnd's probes run the kilnd of the image; that containers are
non-root on a read-only root file system with no capabilities and bounded resources; that
Secrets are placeholders, never keys; and that kilnd accepts its ConfigMap's configuration
(`kilnd --print-paths --config FILE`, which parses and checks every setting and touches no
file), every file it names being mounted where kilnd reads it.

kubeconform and kubectl run too where they are installed (schemas; `kubectl kustomize`); the
output says which did not. Exit status: 0 when no error was found, 1 otherwise.

Usage: check_manifests.py [--kilnd KILND] [DIR]   (default DIR: deploy/kubernetes)
KILND: the kilnd whose configuration parser judges the ConfigMap (default $KILN_KILND, else
build/daemon/kilnd, else kilnd on PATH; without one, the option names of daemon/config.cc)."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

import yaml

ROOT = Path(__file__).resolve().parents[1]

# The kinds this deployment is made of, at the apiVersion Kubernetes serves them.
API_VERSIONS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "PodDisruptionBudget": "policy/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}
WORKLOADS = ("StatefulSet", "Deployment")
KILND_IMAGE = "kiln/kilnd"
# kilnd settings that name files kilnd reads.
FILE_KEYS = ("tls_cert", "tls_key", "token_file", "mac_key_file", "redis_password_file",
             "redis_tls_ca", "redis_tls_cert", "redis_tls_key")
# Settings of a kilnd being written now: a kilnd that refuses one of these is reported (its image
# would refuse this ConfigMap), as a warning, and the rest of the file is checked without it.
PENDING_KEYS = {"metrics_listen": "Prometheus metrics"}


class Report:
    def __init__(self):
        self.errors, self.warnings, self.notes = [], [], []

    def error(self, where, message):
        self.errors.append(f"{where}: {message}")

    def warn(self, where, message):
        self.warnings.append(f"{where}: {message}")


def load(directory: Path, report: Report):
    """(file, document) for every YAML document under `directory`."""
    docs = []
    for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as e:
            report.error(path.name, f"does not parse: {e}")
            continue
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                report.error(path.name, "a document that is not a mapping")
                continue
            docs.append((path.name, doc))
    if not docs:
        report.error(str(directory), "no manifests")
    return docs


def name_of(file, doc):
    return f"{file}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def containers(doc):
    spec = pod_spec(doc)
    return [("initContainer", c) for c in spec.get("initContainers") or []] + \
           [("container", c) for c in spec.get("containers") or []]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_shape(docs, report):
    """apiVersion, kind, name, one namespace; returns the objects by (kind, name)."""
    objects, namespaces, declared_namespace = {}, set(), None
    for file, doc in docs:
        kind, where = doc.get("kind"), name_of(file, doc)
        if kind not in API_VERSIONS:
            report.error(where, f"kind {kind!r} is not one this deployment uses")
            continue
        if doc.get("apiVersion") != API_VERSIONS[kind]:
            report.error(where, f"apiVersion {doc.get('apiVersion')!r}, expected "
                                f"{API_VERSIONS[kind]!r}")
        if kind == "Kustomization":
            continue
        meta = doc.get("metadata") or {}
        if not meta.get("name"):
            report.error(where, "no metadata.name")
            continue
        if (kind, meta["name"]) in objects:
            report.error(where, "defined twice")
        if kind in WORKLOADS and not isinstance(
                ((doc.get("spec") or {}).get("template") or {}).get("spec"), dict):
            report.error(where, "no spec.template.spec")
            continue
        objects[(kind, meta["name"])] = (file, doc)
        if kind == "Namespace":
            declared_namespace = meta["name"]
        else:
            namespaces.add(meta.get("namespace"))
    if len(namespaces) > 1:
        report.error("namespaces", f"objects in several namespaces: {sorted(map(str, namespaces))}")
    elif declared_namespace and namespaces and namespaces != {declared_namespace}:
        report.error("namespaces", f"objects in {namespaces.pop()!r}, the Namespace is "
                                   f"{declared_namespace!r}")
    return objects


def check_kustomization(directory, docs, report):
    for file, doc in docs:
        if doc.get("kind") != "Kustomization":
            continue
        listed = doc.get("resources") or []
        for resource in listed:
            if not (directory / resource).exists():
                report.error(file, f"lists {resource}, which does not exist")
        applied = {f for f, d in docs if d.get("kind") != "Kustomization"}
        for missing in sorted(applied - set(listed)):
            if not missing.endswith(".example.yaml"):
                report.error(file, f"does not list {missing}")
        for resource in listed:
            if resource.endswith(".example.yaml"):
                report.error(file, f"lists the template {resource}: placeholders would be applied")


def check_secrets(objects, report):
    """Templates only: placeholders in stringData, never data (base64 of a real key)."""
    for (kind, _), (file, doc) in objects.items():
        if kind != "Secret":
            continue
        where = name_of(file, doc)
        if doc.get("data"):
            report.error(where, "has data: Secrets here are templates (stringData placeholders); "
                                "real keys are created with kubectl, never committed")
        for key, value in (doc.get("stringData") or {}).items():
            if "REPLACE" not in str(value):
                report.error(where, f"{key} is not a placeholder (REPLACE...): never commit keys")


def referenced(kind, name, objects, where, report, what):
    if (kind, name) not in objects:
        report.error(where, f"{what} names {kind} {name!r}, which is not in the set")
        return None
    return objects[(kind, name)][1]


def object_keys(doc):
    return set((doc.get("data") or {})) | set((doc.get("stringData") or {}))


def check_workload(file, doc, objects, report):
    where = name_of(file, doc)
    spec = doc.get("spec") or {}
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    if not selects(match, template_labels):
        report.error(where, f"selector {match} does not select its pods' labels {template_labels}")
    if doc["kind"] == "StatefulSet":
        service = referenced("Service", spec.get("serviceName"), objects, where, report,
                             "serviceName")
        if service is not None and (service.get("spec") or {}).get("clusterIP") != "None":
            report.error(where, f"serviceName {spec.get('serviceName')!r} is not headless")
    pod = pod_spec(doc)
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates") or []}
    for name, volume in volumes.items():
        if "secret" in volume:
            secret = referenced("Secret", volume["secret"].get("secretName"), objects, where,
                                report, f"volume {name}")
            for item in volume["secret"].get("items") or []:
                if secret is not None and item["key"] not in object_keys(secret):
                    report.error(where, f"volume {name} takes key {item['key']!r}, which "
                                        f"Secret {volume['secret']['secretName']} lacks")
        if "configMap" in volume:
            referenced("ConfigMap", volume["configMap"].get("name"), objects, where, report,
                       f"volume {name}")
        if "persistentVolumeClaim" in volume:
            report.error(where, f"volume {name}: a claim outside the set; use "
                                "volumeClaimTemplates")
    security = pod.get("securityContext") or {}
    for role, c in containers(doc):
        cwhere = f"{where} {role} {c.get('name')}"
        for mount in c.get("volumeMounts") or []:
            if mount["name"] not in volumes and mount["name"] not in claims:
                report.error(cwhere, f"mounts {mount['name']!r}, which is no volume of the pod")
        for env in c.get("env") or []:
            ref = (env.get("valueFrom") or {})
            for ref_kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                if key in ref:
                    target = referenced(ref_kind, ref[key]["name"], objects, cwhere, report,
                                        f"env {env['name']}")
                    if target is not None and ref[key]["key"] not in object_keys(target):
                        report.error(cwhere, f"env {env['name']} takes key {ref[key]['key']!r}, "
                                             f"which {ref_kind} {ref[key]['name']} lacks")
        csec = c.get("securityContext") or {}
        if not (csec.get("runAsNonRoot") or security.get("runAsNonRoot")):
            report.error(cwhere, "may run as root (runAsNonRoot)")
        if csec.get("readOnlyRootFilesystem") is not True:
            report.error(cwhere, "root file system is writable (readOnlyRootFilesystem)")
        if csec.get("allowPrivilegeEscalation") is not False:
            report.error(cwhere, "allowPrivilegeEscalation is not false")
        if "ALL" not in ((csec.get("capabilities") or {}).get("drop") or []):
            report.error(cwhere, "keeps capabilities (capabilities.drop: [ALL])")
        resources = c.get("resources") or {}
        for part in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in (resources.get(part) or {}):
                    report.error(cwhere, f"no {part}.{resource}")
        ports = {p.get("name") for p in c.get("ports") or []}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            named = ((c.get(probe) or {}).get("tcpSocket") or {}).get("port")
            if isinstance(named, str) and named not in ports:
                report.error(cwhere, f"{probe} names port {named!r}, which it does not declare")
        if role == "container" and not (c.get("readinessProbe") and c.get("livenessProbe")):
            report.error(cwhere, "needs a readinessProbe and a livenessProbe")


def pods_selected(selector, objects):
    return [(file, doc) for (kind, _), (file, doc) in objects.items()
            if kind in WORKLOADS and selects(selector, doc["spec"]["template"]["metadata"]
                                             .get("labels") or {})]


def check_selectors(objects, report):
    for (kind, _), (file, doc) in objects.items():
        where = name_of(file, doc)
        if kind == "Service":
            selector = (doc.get("spec") or {}).get("selector") or {}
            pods = pods_selected(selector, objects)
            if not pods:
                report.error(where, f"selector {selector} selects no pod of the set")
            declared = {p.get("name"): p.get("containerPort") for _, pod in pods
                        for _, c in containers(pod) for p in c.get("ports") or []}
            for port in doc["spec"].get("ports") or []:
                target = port.get("targetPort", port.get("port"))
                if isinstance(target, str) and target not in declared:
                    report.error(where, f"port {port.get('name')} targets {target!r}, which its "
                                        "pods do not declare")
                if isinstance(target, int) and target not in declared.values():
                    report.error(where, f"port {port.get('name')} targets {target}, which its "
                                        "pods do not declare")
        elif kind == "PodDisruptionBudget":
            if not pods_selected((doc["spec"].get("selector") or {}).get("matchLabels"), objects):
                report.error(where, "selects no pod of the set")
        elif kind == "NetworkPolicy":
            spec = doc.get("spec") or {}
            if not pods_selected((spec.get("podSelector") or {}).get("matchLabels"), objects):
                report.error(where, "podSelector selects no pod of the set")
            for rule in spec.get("ingress") or []:
                for peer in rule.get("from") or []:
                    labels = (peer.get("podSelector") or {}).get("matchLabels")
                    if labels is not None and not pods_selected(labels, objects):
                        report.error(where, f"ingress from {labels}, which selects no pod")


def kilnd_entrypoint():
    """The kilnd binary of the image: the first word of docker/kilnd.Dockerfile's ENTRYPOINT."""
    text = (ROOT / "docker" / "kilnd.Dockerfile").read_text()
    match = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
    return json.loads(match.group(1))[0] if match else None


def parse_config(text):
    settings = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            settings[key.strip().replace("-", "_")] = value.strip()
    return settings


def under(path, mounts):
    """The mount that holds `path`, the deepest one."""
    best = None
    for mount in mounts:
        root = PurePosixPath(mount["mountPath"])
        if PurePosixPath(path) == root or root in PurePosixPath(path).parents:
            if best is None or len(root.parts) > len(PurePosixPath(best["mountPath"]).parts):
                best = mount
    return best


def option_names_from_source():
    """kilnd's option names as daemon/config.cc spells them (IsValueFlag, IsBoolFlag)."""
    text = (ROOT / "daemon" / "config.cc").read_text()
    names = set()
    for function in ("IsBoolFlag", "IsValueFlag"):
        body = re.search(function + r"\(.*?\n}\n", text, re.S)
        if body:
            names |= set(re.findall(r'"([a-z][a-z0-9-]*)"', body.group(0)))
    return {n.replace("-", "_") for n in names} - {"config"}


def find_kilnd(explicit):
    for candidate in (explicit, os.environ.get("KILN_KILND"), ROOT / "build" / "daemon" / "kilnd",
                      shutil.which("kilnd")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def check_config_with_kilnd(kilnd, text, where, report):
    """kilnd's own parser: unknown keys, bad values and combinations (TCP without TLS) fail."""
    lines = text.splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": tmp}
        while True:
            conf = Path(tmp) / "kilnd.conf"
            conf.write_text("\n".join(lines) + "\n")
            done = subprocess.run([kilnd, "--print-paths", "--config", str(conf)], env=env,
                                  capture_output=True, text=True, timeout=30)
            if done.returncode == 0:
                return
            why = done.stderr.strip().splitlines()[0] if done.stderr.strip() else \
                f"exit status {done.returncode}"
            unknown = re.search(r"unknown option --([a-z0-9-]+)", why)
            pending = unknown and unknown.group(1).replace("-", "_")
            kept = [l for l in lines if parse_config(l).keys() != {pending}]
            if pending in PENDING_KEYS and len(kept) < len(lines):
                report.warn(where, f"{pending} ({PENDING_KEYS[pending]}) is not known to "
                                   f"{kilnd}: an image of that kilnd refuses this file")
                lines = kept
                continue
            report.error(where, f"kilnd refuses it: {why}")
            return


def check_kilnd(objects, kilnd, report):
    entry = kilnd_entrypoint()
    for (kind, _), (file, doc) in objects.items():
        if kind not in WORKLOADS:
            continue
        pod = pod_spec(doc)
        for role, c in containers(doc):
            repository = str(c.get("image", "")).split("@")[0].rsplit(":", 1)[0]
            if repository != KILND_IMAGE and not repository.endswith("/" + KILND_IMAGE):
                continue
            where = f"{name_of(file, doc)} {role} {c.get('name')}"
            if role == "initContainer":
                continue
            args = c.get("args") or []
            if "--config" not in args or args.index("--config") + 1 >= len(args):
                report.error(where, "gives kilnd no --config")
                continue
            conf_path = PurePosixPath(args[args.index("--config") + 1])
            mounts = c.get("volumeMounts") or []
            mount = under(str(conf_path), mounts)
            volumes = {v["name"]: v for v in pod.get("volumes") or []}
            source = volumes.get(mount["name"], {}).get("configMap") if mount else None
            if source is None:
                report.error(where, f"--config {conf_path} is in no ConfigMap volume")
                continue
            config_map = objects.get(("ConfigMap", source["name"]), (None, {}))[1]
            key = str(conf_path.relative_to(mount["mountPath"]))
            text = (config_map.get("data") or {}).get(key)
            if text is None:
                report.error(where, f"ConfigMap {source['name']} has no key {key}")
                continue
            settings = parse_config(text)
            cwhere = f"ConfigMap {source['name']} {key}"
            if kilnd:
                check_config_with_kilnd(kilnd, text, cwhere, report)
            else:
                known = option_names_from_source()
                for unknown in sorted(set(settings) - known):
                    if unknown in PENDING_KEYS:
                        report.warn(cwhere, f"{unknown} ({PENDING_KEYS[unknown]}) is not in "
                                            "daemon/config.cc yet: kilnd refuses this file")
                    else:
                        report.error(cwhere, f"{unknown} is no option of kilnd (daemon/config.cc)")
            check_kilnd_paths(settings, mounts, volumes, where, report)
            check_kilnd_ports(settings, c, doc, objects, where, report)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                command = ((c.get(probe) or {}).get("exec") or {}).get("command") or []
                if not command:
                    continue
                if command[0] != entry:
                    report.error(where, f"{probe} runs {command[0]}, not the image's kilnd "
                                        f"{entry}")
                if "--socket" in command and \
                        command[command.index("--socket") + 1] != settings.get("socket"):
                    report.error(where, f"{probe} asks {command[command.index('--socket') + 1]},"
                                        f" kilnd serves {settings.get('socket')}")


def check_kilnd_paths(settings, mounts, volumes, where, report):
    for key in FILE_KEYS:
        if key in settings and under(settings[key], mounts) is None:
            report.error(where, f"{key} {settings[key]} is on no volume of the container")
    for key in ("cache_dir", "socket"):
        if key not in settings:
            report.error(where, f"the ConfigMap sets no {key}: kilnd's default is not a volume")
            continue
        directory = settings[key]
        if key == "socket":
            directory = str(PurePosixPath(directory).parent)
        mount = under(directory, mounts)
        if mount is None or mount.get("readOnly"):
            report.error(where, f"{key} {settings[key]} is on no writable volume "
                                "(the root file system is read-only)")
        elif PurePosixPath(mount["mountPath"]) == PurePosixPath(directory):
            # A volume's root belongs to root (or is shared): kilnd refuses it as its own.
            report.error(where, f"{key} {directory} is a volume's root, which kilnd refuses as "
                                "not its own: use a directory inside it")


def check_kilnd_ports(settings, c, doc, objects, where, report):
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    listen = settings.get("listen", "")
    if listen.startswith("tcp://"):
        port = int(listen.rsplit(":", 1)[1])
        if ports.get("grpc") != port:
            report.error(where, f"kilnd listens on {port}; the container's grpc port is "
                                f"{ports.get('grpc')}")
    metrics = settings.get("metrics_listen")
    annotations = doc["spec"]["template"]["metadata"].get("annotations") or {}
    if metrics:
        port = int(metrics.rsplit(":", 1)[1])
        if ports.get("metrics") != port:
            report.error(where, f"metrics on {port}; the container's metrics port is "
                                f"{ports.get('metrics')}")
        if annotations.get("prometheus.io/port") != str(port):
            report.error(where, f"prometheus.io/port is {annotations.get('prometheus.io/port')}"
                                f", metrics are served on {port}")
    redis = settings.get("redis")
    if redis and not redis.startswith("unix:"):
        host, _, port = redis.rpartition(":")
        service = host.split(".")[0]
        found = objects.get(("Service", service))
        if found is None or int(port) not in [p.get("port") for p in found[1]["spec"]["ports"]]:
            report.error(where, f"redis {redis}: no Service {service} with port {port} in the set")


def run_external(directory, report):
    kubeconform = shutil.which("kubeconform")
    if kubeconform:
        files = [str(p) for p in sorted(directory.glob("*.yaml")) if p.name != "kustomization.yaml"]
        done = subprocess.run([kubeconform, "-strict", "-summary", *files], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            report.error("kubeconform", (done.stdout + done.stderr).strip())
        else:
            report.notes.append("kubeconform: schemas pass")
    else:
        report.notes.append("kubeconform is not installed: no schema validation")
    kubectl = shutil.which("kubectl")
    if kubectl and (directory / "kustomization.yaml").exists():
        done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            report.error("kubectl kustomize", done.stderr.strip())
        else:
            report.notes.append("kubectl kustomize: renders")
    elif not kubectl:
        report.notes.append("kubectl is not installed: the kustomization is not rendered")


def check(directory: Path, kilnd=None) -> Report:
    report = Report()
    docs = load(directory, report)
    objects = check_shape(docs, report)
    check_kustomization(directory, docs, report)
    check_secrets(objects, report)
    for (kind, _), (file, doc) in objects.items():
        if kind in WORKLOADS:
            check_workload(file, doc, objects, report)
    check_selectors(objects, report)
    kilnd = find_kilnd(kilnd)
    if kilnd is None:
        report.notes.append("no kilnd binary: ConfigMap keys checked against daemon/config.cc")
    check_kilnd(objects, kilnd, report)
    run_external(directory, report)
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", default=str(ROOT / "deploy" / "kubernetes"))
    parser.add_argument("--kilnd", help="the kilnd that judges the ConfigMap")
    args = parser.parse_args(argv)
    report = check(Path(args.directory), args.kilnd)
    for note in report.notes:
        print(f"note: {note}")
    for warning in report.warnings:
        print(f"warning: {warning}")
    for error in report.errors:
        print(f"error: {error}")
    print(f"check_manifests: {len(report.errors)} errors, {len(report.warnings)} warnings")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
