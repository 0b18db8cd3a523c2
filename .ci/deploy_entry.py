#!/usr/bin/env python3
"""Runs the containers' entry commands as plain processes, since no image can
be built here (no registry for base images, no Docker engine).

The commands are read from the files themselves, not copied: the images'
ENTRYPOINT and HEALTHCHECK (deploy/Dockerfile.*), the Compose services'
command and healthcheck (deploy/compose.yaml), and the Kubernetes containers'
args, env and probes (deploy/k8s/*.yaml). Each is run in a small stand-in for
a container:

* its own network namespace, with only a loopback interface, so that the
  coordinator binds its real address (0.0.0.0:50051, reachable from nothing
  but this namespace's loopback) and the default port of `nq-coord health`
  is free;
* a chroot whose root is read-only (the host's /usr and /etc, read-only),
  with the binaries in /usr/local/bin as in the images, a writable /data
  owned by uid 10001 (the images' VOLUME; the Kubernetes PersistentVolume
  with fsGroup 10001), and an /etc/hosts that maps the Compose service and
  Kubernetes Service name nq-coord to 127.0.0.1;
* uid and gid 10001, the images' USER and the pods' runAsUser.

The one change made to the commands: the board size becomes 10 (the
deployments count 18, which takes minutes in a debug build).

For Compose and for Kubernetes, it checks that the health command fails while
no coordinator runs, that it passes while the coordinator serves, and that the
coordinator's entry with two workers' entries counts N = 10 exactly (724),
every process exiting 0.

Usage (as root: namespaces, mounts and chroot need it):
    python3 .ci/deploy_entry.py --bin target/debug
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UID = GID = 10001
N_TEST = "10"
TOTAL_N10 = 724  # published count of N = 10 (OEIS A000170)
SERVICE = "nqueens.v1.Coordinator"
# Debian's PATH in the images (debian:bookworm-slim).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Bounds on each wait, so that a broken run fails instead of hanging; the
# runs themselves take about a second.
WAIT_S = 120
TOKEN = "entry-test-token"


class Failure(Exception):
    """A check failed; the message says which and why."""


# ---------------------------------------------------------------- the files


def dockerfile(path: Path) -> dict[str, list[str]]:
    """The exec-form ENTRYPOINT, HEALTHCHECK CMD, USER and WORKDIR of the
    final stage of a Dockerfile."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            out = {}  # only the final stage's instructions count
        elif line.startswith("ENTRYPOINT "):
            out["entrypoint"] = json.loads(line[len("ENTRYPOINT ") :])
        elif line.startswith("HEALTHCHECK "):
            cmd = line.split(" CMD ", 1)
            if len(cmd) != 2:
                raise Failure(f"{path}: HEALTHCHECK without CMD: {line}")
            out["healthcheck"] = json.loads(cmd[1])
        elif line.startswith("USER "):
            out["user"] = [line.split()[1]]
        elif line.startswith("WORKDIR "):
            out["workdir"] = [line.split()[1]]
    for key in ("entrypoint", "user"):
        if key not in out:
            raise Failure(f"{path}: no exec-form {key.upper()} in the final stage")
    if out["user"][0] != f"{UID}:{GID}":
        raise Failure(f"{path}: USER is {out['user'][0]}, expected {UID}:{GID}")
    return out


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} forms, and $$ for
    a literal $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":-":
            return arg
        if op == ":?":
            raise Failure(f"compose: {name} must be set: {arg}")
        return ""

    return re.sub(r"\$\$|\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", sub, value)


def k8s_env(container: dict) -> dict[str, str]:
    """A container's env as the kubelet sets it: literal values, the token
    Secret, and requests/limits through the downward API."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        src = var["valueFrom"]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            if (ref["name"], ref["key"]) != ("nq-token", "token"):
                raise Failure(f"{var['name']}: unexpected Secret {ref}")
            env[var["name"]] = TOKEN
        elif "resourceFieldRef" in src:
            ref = src["resourceFieldRef"]
            if ref.get("containerName", container["name"]) != container["name"]:
                raise Failure(f"{var['name']}: refers to another container")
            kind, _, res = ref["resource"].partition(".")
            if res != "cpu" or str(ref.get("divisor", "1")) != "1":
                raise Failure(f"{var['name']}: only cpu with divisor 1 is handled")
            cpu = str(container["resources"][kind]["cpu"])
            cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
            env[var["name"]] = str(math.ceil(cores))  # the kubelet rounds up
        else:
            raise Failure(f"{var['name']}: unhandled valueFrom {src}")
    return env


def k8s_expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args ($$ escapes)."""
    return re.sub(
        r"\$\$|\$\((\w+)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        arg,
    )


def set_n(argv: list[str], where: str, n: str = N_TEST) -> list[str]:
    """The test's one change: --n 10 (or n) instead of the deployment's board."""
    if "--n" not in argv:
        raise Failure(f"{where}: the coordinator command has no --n: {argv}")
    i = argv.index("--n")
    return argv[: i + 1] + [n] + argv[i + 2 :]


def shown(cmd: list[str]) -> str:
    """A command for the log; a `/bin/sh -c SCRIPT NAME ARGS...` wrapper
    shows as NAME ARGS... with a note."""
    if cmd[:2] == ["/bin/sh", "-c"] and len(cmd) > 3:
        return shlex.join(cmd[3:]) + "  (under the manifest's /bin/sh wrapper)"
    return shlex.join(cmd)


# ---------------------------------------------------------------- the sandbox


def loopback_up() -> None:
    """Brings `lo` up in the new network namespace (SIOCSIFFLAGS)."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


class Jail:
    """A read-only root with the binaries, /etc/hosts and a writable /data."""

    def __init__(self, base: Path, bindir: Path):
        self.root = base / "root"
        self.data = base / "data"
        stage = base / "bin"
        for d in (self.root, self.data, stage):
            d.mkdir()
        for name in ("nq-coord", "nq-worker"):
            shutil.copy(bindir / name, stage / name)
            (stage / name).chmod(0o755)
        os.chown(self.data, UID, GID)
        hosts = base / "hosts"
        hosts.write_text("127.0.0.1 localhost nq-coord\n")

        r = self.root
        mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", str(r))
        for d in ("usr", "etc", "dev", "proc", "sys", "data", "run"):
            (r / d).mkdir()
        (r / "run/secrets").mkdir()
        # Merged /usr (as in Debian): /bin, /lib... are links into /usr.
        for d in ("bin", "sbin", "lib", "lib64"):
            if Path("/" + d).is_symlink():
                (r / d).symlink_to(os.readlink("/" + d))
            elif Path("/" + d).is_dir():
                (r / d).mkdir()
                self.bind("/" + d, r / d, ro=True)
        self.bind("/usr", r / "usr", ro=True)
        self.bind(str(stage), r / "usr/local/bin", ro=True)
        self.bind("/etc", r / "etc", ro=True)
        self.bind(str(hosts), r / "etc/hosts", ro=True)
        for d in ("dev", "proc", "sys"):
            mount("--rbind", "/" + d, str(r / d))
        self.bind(str(self.data), r / "data", ro=False)
        # Compose's secrets: files bind-mounted read-only under /run/secrets.
        self.secrets = base / "secrets"
        self.secrets.mkdir()
        self.bind(str(self.secrets), r / "run/secrets", ro=True)
        mount("-o", "remount,ro", str(r))

    @staticmethod
    def bind(src: str, dst: Path, ro: bool) -> None:
        mount("--bind", src, str(dst))
        if ro:
            mount("-o", "remount,bind,ro", str(dst))

    def argv(self, cmd: list[str], env: dict[str, str], workdir: str) -> list[str]:
        """The command as the container runtime would start it."""
        env = {"PATH": IMAGE_PATH, "HOME": "/", **env}
        return [
            "chroot",
            f"--userspec={UID}:{GID}",
            str(self.root),
            "/usr/bin/env",
            "-i",
            f"--chdir={workdir}",
            *[f"{k}={v}" for k, v in env.items()],
            *cmd,
        ]

    def reset_data(self) -> None:
        for p in self.data.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()


class Proc:
    """A running process whose output lines are collected as they come."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.out: list[str] = []
        self.err: list[str] = []
        self.eof = 0
        self.cond = threading.Condition()
        self.p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.readers = [
            threading.Thread(target=self._read, args=(self.p.stdout, self.out)),
            threading.Thread(target=self._read, args=(self.p.stderr, self.err)),
        ]
        for t in self.readers:
            t.start()

    def _read(self, stream, sink: list[str]) -> None:
        for line in stream:
            with self.cond:
                sink.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof += 1
            self.cond.notify_all()

    def expect(self, which: str, pattern: str) -> None:
        """Waits for a line on stdout ("out") or stderr ("err")."""
        sink = self.out if which == "out" else self.err

        def seen() -> bool:
            return self.eof == 2 or any(re.search(pattern, l) for l in sink)

        with self.cond:
            if not self.cond.wait_for(seen, timeout=WAIT_S):
                raise Failure(f"{self.name}: no line matching {pattern!r} in {WAIT_S}s")
            if not any(re.search(pattern, l) for l in sink):
                raise Failure(f"{self.name}: exited before printing {pattern!r}")

    def wait(self) -> int:
        try:
            rc = self.p.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise Failure(f"{self.name}: still running after {WAIT_S}s")
        for t in self.readers:
            t.join()
        return rc

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def log(self) -> str:
        return "\n".join(
            [f"--- {self.name} stdout"] + self.out + [f"--- {self.name} stderr"] + self.err
        )


# ---------------------------------------------------------------- the runs


def health(jail: Jail, name: str, cmd: list[str], workdir: str, want_ok: bool) -> None:
    p = subprocess.run(jail.argv(cmd, {}, workdir), capture_output=True, text=True,
                       timeout=WAIT_S)
    said = (p.stdout + p.stderr).strip()
    if want_ok and p.returncode != 0:
        raise Failure(f"{name} {shlex.join(cmd)} exited {p.returncode} while serving: {said}")
    if not want_ok and p.returncode == 0:
        raise Failure(f"{name} {shlex.join(cmd)} exited 0 with no coordinator: {said}")
    last = said.splitlines()[-1] if said else "no output"
    print(f"  ok: {name} `{shlex.join(cmd)}` exits {p.returncode} ({last})")


def protected(jail: Jail, workdir: str) -> None:
    """The coordinator got the token: a call without it is refused, a call
    with it is answered (the Status rpc, which needs the token like any
    worker call)."""
    status = ["nq-coord", "status", "--connect", "127.0.0.1:50051"]
    p = subprocess.run(jail.argv(status, {}, workdir), capture_output=True, text=True,
                       timeout=WAIT_S)
    if p.returncode == 0 or "token" not in p.stderr:
        raise Failure(f"the coordinator answered a call without the token: {p.stderr.strip()}")
    p = subprocess.run(jail.argv(status, {"NQ_TOKEN": TOKEN}, workdir),
                       capture_output=True, text=True, timeout=WAIT_S)
    if p.returncode != 0:
        raise Failure(f"the coordinator refused the token: {p.stderr.strip()}")
    print("  ok: the coordinator refuses a call without the token, answers one with it")


def run_cluster(jail: Jail, label: str, coord: tuple, workers: list[tuple],
                checks: list[tuple]) -> str:
    """coord and each worker: (cmd, env, workdir); checks: health commands
    (name, cmd, workdir). Returns the coordinator's result line."""
    print(f"== {label}")
    jail.reset_data()
    for name, cmd, wd in checks:
        health(jail, name, cmd, wd, want_ok=False)
    procs: list[Proc] = []
    try:
        cmd, env, wd = coord
        if "--local-threads" not in cmd or cmd[cmd.index("--local-threads") + 1] != "0":
            raise Failure(f"{label}: expected a coordinator that only serves: {cmd}")
        print(f"  coordinator: {shown(cmd)}")
        c = Proc(f"{label} coordinator", jail.argv(cmd, env, wd))
        procs.append(c)
        c.expect("out", r"^listening on ")
        c.expect("err", r"serving workers")
        for name, hcmd, hwd in checks:
            health(jail, name, hcmd, hwd, want_ok=True)
        protected(jail, wd)
        for i, (cmd, env, wd) in enumerate(workers):
            print(f"  worker {i}: {shown(cmd)}"
                  + (f"  (NQ_THREADS={env['NQ_THREADS']})" if "NQ_THREADS" in env else ""))
            # Each replica runs in its own container (its own host name) in a
            # real deployment; here they share one, so they are told apart by
            # name, or the coordinator would count them as one machine and
            # end the run unchecked (probation needs a second voice).
            env = {**env, "NQ_NAME": f"{label.split(':')[0]}-worker-{i}"}
            procs.append(Proc(f"{label} worker {i}", jail.argv(cmd, env, wd)))
        for p in procs[1:]:
            if (rc := p.wait()) != 0:
                raise Failure(f"{p.name} exited {rc}")
        if (rc := c.wait()) != 0:
            raise Failure(f"{c.name} exited {rc}")
        result = next((l for l in c.out if l.startswith("n=")), None)
        if result is None:
            raise Failure(f"{c.name}: no result line")
        fields = dict(kv.split("=", 1) for kv in result.split())
        if (fields.get("n"), fields.get("status"), fields.get("total")) != (
            N_TEST, "complete", str(TOTAL_N10)):
            raise Failure(f"{c.name}: expected n=10 status=complete total=724, got {result}")
        report = jail.data / "report.json"
        if report.stat().st_uid != UID:
            raise Failure(f"{report} is not owned by uid {UID}")
        print(f"  ok: {result}")
        print(f"  ok: every process exited 0; {report.name} written by uid {UID}")
        return result
    except Failure:
        for p in procs:
            p.kill()
            print(p.log(), file=sys.stderr)
        raise
    finally:
        for p in procs:
            p.kill()


def compose_runs(jail: Jail) -> None:
    coord_df = dockerfile(DEPLOY / "Dockerfile.coord")
    worker_df = dockerfile(DEPLOY / "Dockerfile.worker")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    sc, sw = compose["services"]["nq-coord"], compose["services"]["nq-worker"]
    # The token file as deploy/README.md has the operator make it: owned by
    # the images' user, mode 0400, named by NQ_TOKEN_FILE.
    token_src = jail.secrets.parent / "token-on-the-host"
    token_src.write_text(TOKEN + "\n")
    os.chown(token_src, UID, GID)
    token_src.chmod(0o400)
    host_env = {**os.environ, "NQ_TOKEN_FILE": str(token_src)}
    for service in (sc, sw):
        if "NQ_TOKEN" in service.get("environment", {}):
            raise Failure("compose: NQ_TOKEN in environment: (docker inspect shows it); "
                          "the token is the secret nq_token")
    # Each secret a service names, as Compose mounts it: the file itself,
    # owner and mode kept, at /run/secrets/NAME.
    for name in {n for service in (sc, sw) for n in service.get("secrets", [])}:
        src = Path(interpolate(compose["secrets"][name]["file"], host_env))
        shutil.copy2(src, jail.secrets / name)
        st = src.stat()
        os.chown(jail.secrets / name, st.st_uid, st.st_gid)

    def env_of(service: dict) -> dict[str, str]:
        env = service.get("environment", {})
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env)
        return {k: interpolate(str(v), host_env) for k, v in env.items()}

    def check_of(test: list[str], where: str) -> list[str]:
        if not test or test[0] != "CMD":
            raise Failure(f"{where}: expected an exec-form [\"CMD\", ...] healthcheck")
        return test[1:]

    coord_wd = coord_df.get("workdir", ["/"])[0]
    worker_wd = worker_df.get("workdir", ["/"])[0]
    def entry(service: dict, df: dict) -> list[str]:
        """The service's entrypoint (the image's unless it sets one) and
        command, interpolated as Compose does."""
        argv = [str(a) for a in service.get("entrypoint", df["entrypoint"])]
        argv += [str(a) for a in service["command"]]
        return [interpolate(a, host_env) for a in argv]

    coord = (set_n(entry(sc, coord_df), "compose nq-coord"), env_of(sc), coord_wd)
    workers = [(entry(sw, worker_df), env_of(sw), worker_wd)] * 2
    checks = [
        ("Dockerfile.coord HEALTHCHECK", coord_df["healthcheck"], coord_wd),
        ("compose healthcheck", check_of(sc["healthcheck"]["test"], "compose nq-coord"),
         coord_wd),
    ]
    run_cluster(jail, "compose: nq-coord + 2 x nq-worker", coord, workers, checks)


def ignored_exit_codes(job: dict, container: str) -> set[int]:
    """The exit codes of `container` that the Job's podFailurePolicy ignores
    (a new pod, not counted as a failure)."""
    codes: set[int] = set()
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        req = rule.get("onExitCodes")
        if rule["action"] == "Ignore" and req and req.get("operator") == "In" \
                and req.get("containerName", container) == container:
            codes.update(req["values"])
    return codes


def rerun_finished(jail: Jail, label: str, coord: tuple, result: str) -> None:
    """The coordinator's Job created again on the finished volume: it prints
    the stored result and exits 0 at once, without serving."""
    cmd, env, wd = coord
    c = Proc(f"{label} coordinator (finished volume)", jail.argv(cmd, env, wd))
    try:
        if (rc := c.wait()) != 0:
            raise Failure(f"{c.name} exited {rc}")
        again = next((l for l in c.out if l.startswith("n=")), None)
        # The same line but for `seconds` (the live report rounds it, the
        # stored one keeps milliseconds).
        strip = lambda line: re.sub(r" seconds=[0-9.]+ ", " ", line or "")
        if strip(again) != strip(result):
            raise Failure(f"{c.name}: printed {again!r}, not the stored {result!r}")
        if any("serving workers" in l for l in c.err):
            raise Failure(f"{c.name}: served workers again")
        print(f"  ok: on the finished volume the coordinator printed the stored result "
              f"and exited 0 without serving (the Job completes at once)")
    except Failure:
        print(c.log(), file=sys.stderr)
        raise
    finally:
        c.kill()


def drain(jail: Jail, coord: tuple, worker: tuple, coord_job: dict,
          worker_job: dict) -> None:
    """SIGTERM mid-run, as a node drain or an eviction sends it: the worker's
    wrapper exits 143 (not 0, which would end a work-queue Job) and the
    coordinator 3; both codes are ones the Jobs' podFailurePolicy ignores, so
    each pod is replaced and the run goes on."""
    print("== kubernetes: SIGTERM mid-run (a drain): the exits the Jobs replace")
    jail.reset_data()
    # N = 20: minutes of work for one debug worker; the signal comes as soon
    # as it registered.
    cmd, env, wd = coord
    cmd = set_n(cmd, "Job nq-coord", "20")
    procs: list[Proc] = []
    try:
        c = Proc("drain coordinator", jail.argv(cmd, env, wd))
        procs.append(c)
        c.expect("err", r"serving workers")
        wcmd, wenv, wwd = worker
        w = Proc("drain worker", jail.argv(wcmd, wenv, wwd))
        procs.append(w)
        c.expect("err", r"worker registered")
        w.p.send_signal(signal.SIGTERM)
        rc = w.wait()
        if rc != 143 or rc not in ignored_exit_codes(worker_job, "worker"):
            raise Failure(f"the drained worker exited {rc}: expected 143, which "
                          "Job nq-worker's podFailurePolicy ignores")
        if not any("drained" in l for l in w.err):
            raise Failure("the drained worker's log does not say that it drained")
        print(f"  ok: the worker drained and its wrapper exited {rc} (ignored: a new pod)")
        c.p.send_signal(signal.SIGTERM)
        rc = c.wait()
        if rc != 3 or rc not in ignored_exit_codes(coord_job, "coordinator"):
            raise Failure(f"the stopped coordinator exited {rc}: expected 3, which "
                          "Job nq-coord's podFailurePolicy ignores")
        print(f"  ok: the stopped coordinator exited {rc} (ignored: a new pod resumes)")
    except Failure:
        for p in procs:
            p.kill()
            print(p.log(), file=sys.stderr)
        raise
    finally:
        for p in procs:
            p.kill()


def k8s_runs(jail: Jail) -> None:
    coord_df = dockerfile(DEPLOY / "Dockerfile.coord")
    worker_df = dockerfile(DEPLOY / "Dockerfile.worker")
    docs = {}
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d and "metadata" in d:
                docs[(d["kind"], d["metadata"]["name"])] = d
    coord_job = docs[("Job", "nq-coord")]
    worker_job = docs[("Job", "nq-worker")]
    svc = docs[("Service", "nq-coord")]["spec"]

    def container(spec: dict, image: str, df: dict) -> tuple:
        (c,) = spec["containers"]
        if c["image"] != image:
            raise Failure(f"{c['name']}: image {c['image']}, expected {image}")
        env = k8s_env(c)
        cmd = c.get("command", df["entrypoint"]) + c.get("args", [])
        return c, [k8s_expand(str(a), env) for a in cmd], env, df.get("workdir", ["/"])[0]

    cc, ccmd, cenv, cwd = container(coord_job["spec"]["template"]["spec"], "nq-coord",
                                    coord_df)
    wc, wcmd, wenv, wwd = container(worker_job["spec"]["template"]["spec"], "nq-worker",
                                    worker_df)
    port = svc["ports"][0]["port"]
    listen = ccmd[ccmd.index("--listen") + 1]
    if not listen.endswith(f":{port}"):
        raise Failure(f"the coordinator listens on {listen}, the Service is on {port}")
    # The kubelet's native gRPC probe asks grpc.health.v1 for this service
    # on this port; `nq-coord health` asks the same question.
    checks = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = cc[kind]["grpc"]
        if probe.get("service") != SERVICE or probe["port"] != port:
            raise Failure(f"{kind}: expected grpc service {SERVICE} on {port}: {probe}")
    checks.append((f"probe equivalent (grpc :{port} {SERVICE})",
                   ["nq-coord", "health", "--connect", f"127.0.0.1:{port}"], cwd))
    label = "kubernetes: Job nq-coord + 2 pods of Job nq-worker"
    coord = (set_n(ccmd, "Job nq-coord"), cenv, cwd)
    result = run_cluster(jail, label, coord, [(wcmd, wenv, wwd)] * 2, checks)
    rerun_finished(jail, label, coord, result)
    drain(jail, (ccmd, cenv, cwd), (wcmd, wenv, wwd), coord_job, worker_job)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, default=ROOT / "target/debug",
                    help="directory with nq-coord and nq-worker (default: target/debug)")
    args = ap.parse_args()
    for name in ("nq-coord", "nq-worker"):
        if not (args.bin / name).is_file():
            print(f"deploy_entry: {args.bin / name} is missing: build it first "
                  "(cargo build -p nq-coord -p nq-worker)", file=sys.stderr)
            return 1
    if os.environ.get("NQ_ENTRY_IN_NAMESPACE") != "1":
        if os.geteuid() != 0:
            print("deploy_entry: needs root (network and mount namespaces, chroot, "
                  "uid 10001)", file=sys.stderr)
            return 1
        # Again, inside fresh network and mount namespaces (private mounts).
        env = {**os.environ, "NQ_ENTRY_IN_NAMESPACE": "1"}
        argv = ["unshare", "--net", "--mount", "--propagation", "private", "--fork",
                sys.executable, __file__, "--bin", str(args.bin.resolve())]
        return subprocess.run(argv, env=env).returncode

    loopback_up()
    with tempfile.TemporaryDirectory(prefix="nq-entry-") as base:
        os.chmod(base, 0o755)
        try:
            jail = Jail(Path(base), args.bin)
            # The stand-in is as strict as the containers are meant to be.
            p = subprocess.run(jail.argv(["touch", "/probe"], {}, "/"), capture_output=True)
            if p.returncode == 0:
                raise Failure("the sandbox's root is writable")
            compose_runs(jail)
            k8s_runs(jail)
        except Failure as e:
            print(f"deploy_entry: FAIL: {e}", file=sys.stderr)
            return 1
        finally:
            # The mounts vanish with the namespace; unmount the tmpfs so that
            # the temporary directory can be removed.
            subprocess.run(["umount", "-R", str(Path(base) / "root")], check=False)
    print("deploy_entry: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
