#!/usr/bin/env python3
"""Consistency checks of deploy/ that no schema can make.

* deploy/k8s/kustomization.yaml lists exactly the manifests present (every
  *.yaml but itself and the *.example.yaml files, which are not to be applied
  as they are), its images: and replicas: name what the manifests use, and the
  Secret that the pods read is the one the example shows.
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
        if p.name != "kustomization.yaml" and not p.name.endswith(".example.yaml")
    )
    if len(set(listed)) != len(listed):
        problem(f"{kust_path}: resources lists a file twice: {listed}")
    for name in sorted(set(present) - set(listed)):
        problem(f"{kust_path}: {name} is in deploy/k8s but not in resources")
    for name in sorted(set(listed) - set(present)):
        problem(f"{kust_path}: resources lists {name}, which is not in deploy/k8s")
    if list(K8S.glob("*.yml")):
        problem("deploy/k8s: use the .yaml extension (the checks read *.yaml)")

    objects = {}
    for name in present:
        for d in load_all(K8S / name):
            objects[(d["kind"], d["metadata"]["name"])] = d
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
    sts = objects.get(("StatefulSet", "nq-coord"))
    if sts is None or sts["spec"].get("replicas") != 1:
        problem("the coordinator must be a StatefulSet nq-coord of exactly 1 replica")

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
