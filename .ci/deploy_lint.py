#!/usr/bin/env python3
"""Consistency checks of deploy/ that no schema can make.

* deploy/k8s/kustomization.yaml lists exactly the manifests present (every
  *.yaml but itself, the *.example.yaml files, which are not to be applied
  as they are, and the coordinator's volume claim, which is applied once and
  kept out so that `kubectl delete -k` leaves the results), its images: and
  replicas: name what the manifests use, and the Secret that the pods read is
  the one the example shows.
* The run ends: coordinator and workers are Jobs that restart no container
  in place (restartPolicy Never, so that podFailurePolicy sees each exit),
  the coordinator is one pod on a claim defined in deploy/k8s, and the
  policies name real containers.
* The coordinator serves --metrics, on the port its scrape annotations (and
  Compose's labels) name.
* Every stop timeout is longer than the worker's drain time (--grace):
  Kubernetes' terminationGracePeriodSeconds and Compose's stop_grace_period.
* Compose: the build files exist, depends_on names a service.

Usage: python3 .ci/deploy_lint.py   (exits 1 and names each problem)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
# Applied once, before the first `kubectl apply -k`, and not listed in
# kustomization.yaml: `kubectl delete -k` must not delete the run's results.
KEPT_OUT = {"coordinator-data.yaml"}

problems: list[str] = []


def problem(msg: str) -> None:
    problems.append(msg)


def seconds(text: str) -> float:
    """A duration as nq's flags (bare seconds, or one unit: 500ms, 30s, 2m)
    and Compose (also 1m30s) write it."""
    text = str(text).strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    units = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|min|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 500ms, 30s, 2m)")
    return sum(float(n) * units[u] for n, u in parts)


def flag(args: list[str], name: str, default: str) -> str:
    args = [str(a) for a in args]
    return args[args.index(name) + 1] if name in args else default


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def check_k8s() -> None:
    kust_path = K8S / "kustomization.yaml"
    kust = yaml.safe_load(kust_path.read_text())
    if (kust.get("apiVersion"), kust.get("kind")) != (
        "kustomize.config.k8s.io/v1beta1",
        "Kustomization",
    ):
        problem(f"{kust_path}: not a kustomize.config.k8s.io/v1beta1 Kustomization")
    listed = kust.get("resources", [])
    present = sorted(
        p.name
        for p in K8S.glob("*.yaml")
        if p.name != "kustomization.yaml"
        and not p.name.endswith(".example.yaml")
        and p.name not in KEPT_OUT
    )
    if len(set(listed)) != len(listed):
        problem(f"{kust_path}: resources lists a file twice: {listed}")
    for name in sorted(set(present) - set(listed)):
        problem(f"{kust_path}: {name} is in deploy/k8s but not in resources")
    for name in sorted(set(listed) - set(present)):
        problem(f"{kust_path}: resources lists {name}, which is not in deploy/k8s")
    if list(K8S.glob("*.yml")):
        problem("deploy/k8s: use the .yaml extension (the checks read *.yaml)")

    for name in sorted(KEPT_OUT):
        if name in listed:
            problem(f"{kust_path}: lists {name}, which must stay out (kubectl delete -k)")
        if not (K8S / name).is_file():
            problem(f"deploy/k8s: {name} is missing")
    objects = {}
    for name in present:
        for d in load_all(K8S / name):
            objects[(d["kind"], d["metadata"]["name"])] = d
    kept = {}
    for name in sorted(KEPT_OUT & {p.name for p in K8S.glob("*.yaml")}):
        for d in load_all(K8S / name):
            kept[(d["kind"], d["metadata"]["name"])] = d
    examples = {}
    for p in K8S.glob("*.example.yaml"):
        for d in load_all(p):
            examples[(d["kind"], d["metadata"]["name"])] = d

    pods = {
        key: d["spec"]["template"]["spec"]
        for key, d in objects.items()
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")
    }
    images = {c["image"] for spec in pods.values() for c in spec["containers"]}
    for img in kust.get("images", []):
        if img["name"] not in images:
            problem(f"{kust_path}: images names {img['name']}, which no container uses")
    for rep in kust.get("replicas", []):
        if not any(k[1] == rep["name"] for k in pods):
            problem(f"{kust_path}: replicas names {rep['name']}, which is no workload")
    check_jobs(objects, kept)

    for (kind, name), spec in pods.items():
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            if not spec.get("securityContext", {}).get("runAsNonRoot"):
                problem(f"{kind}/{name}: runAsNonRoot is not set")
            if not sc.get("readOnlyRootFilesystem"):
                problem(f"{kind}/{name}: readOnlyRootFilesystem is not set")
            res = c.get("resources", {})
            if not res.get("requests") or not res.get("limits"):
                problem(f"{kind}/{name}: resources need requests and limits")
            for var in c.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref is None:
                    continue
                secret = examples.get(("Secret", ref["name"]))
                if secret is None or ref["key"] not in secret.get("stringData", {}):
                    problem(
                        f"{kind}/{name}: {var['name']} reads Secret {ref['name']} key "
                        f"{ref['key']}, which no *.example.yaml shows"
                    )
            if c["name"] == "worker":
                grace = seconds(flag(c.get("args", []), "--grace", "30s"))
                stop = spec.get("terminationGracePeriodSeconds", 30)
                if stop <= grace:
                    problem(
                        f"{kind}/{name}: terminationGracePeriodSeconds {stop} is not "
                        f"longer than the worker's --grace ({grace:g}s)"
                    )
                threads = flag(c.get("args", []), "--threads", "")
                if threads != "$(NQ_THREADS)":
                    problem(f"{kind}/{name}: --threads should be $(NQ_THREADS)")


def metrics_port(args: list[str], where: str) -> str | None:
    """The port of the coordinator's --metrics HOST:PORT, or None (a
    problem) when it has none."""
    addr = flag(args, "--metrics", "")
    if not re.fullmatch(r".+:\d+", addr):
        problem(f"{where}: the coordinator has no --metrics HOST:PORT (Prometheus scrapes it)")
        return None
    return addr.rsplit(":", 1)[1]


def check_jobs(objects: dict, kept: dict) -> None:
    """Coordinator and workers are Jobs that end with the run."""
    coord = objects.get(("Job", "nq-coord"))
    worker = objects.get(("Job", "nq-worker"))
    if coord is None or worker is None:
        problem("deploy/k8s: the coordinator and the workers must be the Jobs nq-coord and nq-worker")
        return
    spec = coord["spec"]
    if spec.get("parallelism", 1) != 1 or spec.get("completions", 1) != 1:
        problem("Job/nq-coord: must run exactly one pod (parallelism and completions 1)")
    if "completions" in worker["spec"]:
        problem("Job/nq-worker: no completions: a work queue that ends when the run does")
    for job in (coord, worker):
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        if pod.get("restartPolicy") != "Never":
            problem(f"Job/{name}: restartPolicy must be Never (podFailurePolicy sees each exit)")
        containers = {c["name"] for c in pod["containers"]}
        for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
            c = rule.get("onExitCodes", {}).get("containerName")
            if c is not None and c not in containers:
                problem(f"Job/{name}: podFailurePolicy names container {c}, which it lacks")
    pod = spec["template"]["spec"]
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    if len(claims) != 1:
        problem(f"Job/nq-coord: expected one volume claim for /data, got {sorted(claims)}")
    for claim in claims:
        if ("PersistentVolumeClaim", claim) not in kept:
            problem(f"Job/nq-coord: claim {claim} is defined in none of {sorted(KEPT_OUT)}")
    (c,) = [c for c in pod["containers"] if c["name"] == "coordinator"]
    port = metrics_port([str(a) for a in c.get("args", [])], "Job/nq-coord")
    notes = spec["template"]["metadata"].get("annotations", {})
    if notes.get("prometheus.io/scrape") != "true" or notes.get("prometheus.io/port") != port:
        problem(
            f"Job/nq-coord: the pod needs prometheus.io/scrape \"true\" and "
            f"prometheus.io/port \"{port}\" (its --metrics port): {notes}"
        )


def check_compose() -> None:
    path = DEPLOY / "compose.yaml"
    compose = yaml.safe_load(path.read_text())
    services = compose.get("services", {})
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            ctx = (path.parent / build["context"]).resolve()
            if not (ctx / build["dockerfile"]).is_file():
                problem(f"{path}: {name}: no Dockerfile at {build['dockerfile']}")
        for dep in svc.get("depends_on", {}) or {}:
            if dep not in services:
                problem(f"{path}: {name} depends on {dep}, which is no service")
        if not svc.get("read_only"):
            problem(f"{path}: {name}: read_only is not set")
    coord = services.get("nq-coord", {})
    port = metrics_port([str(a) for a in coord.get("command", [])], f"{path}: nq-coord")
    labels = coord.get("labels", {})
    if labels.get("prometheus.io/scrape") != "true" or labels.get("prometheus.io/port") != port:
        problem(
            f"{path}: nq-coord needs the labels prometheus.io/scrape \"true\" and "
            f"prometheus.io/port \"{port}\" (its --metrics port): {labels}"
        )
    worker = services.get("nq-worker", {})
    grace = seconds(flag(worker.get("command", []), "--grace", "30s"))
    stop = seconds(worker.get("stop_grace_period", "10s"))
    if stop <= grace:
        problem(
            f"{path}: nq-worker stop_grace_period {stop:g}s is not longer than "
            f"its --grace ({grace:g}s)"
        )


def main() -> int:
    try:
        check_k8s()
        check_compose()
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        problem(f"could not read the deploy files: {type(e).__name__}: {e}")
    for p in problems:
        print(f"deploy_lint: {p}", file=sys.stderr)
    print("deploy_lint: " + ("FAIL" if problems else "PASS"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
