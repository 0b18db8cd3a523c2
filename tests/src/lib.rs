//! `nq-e2e`: the harness of nq's end-to-end tests and of the load-test tool.
//!
//! The tests in `tests/e2e.rs` run real `nq-coord` and `nq-worker` processes
//! on loopback (the only way to test `kill -9` and restarts), and also the
//! libraries in-process. This crate gives them:
//!
//! * [`binary`]: the path of a workspace binary, built first with the same
//!   profile as the test itself, so a test never runs a stale binary;
//! * [`Proc`]: a child process whose stdout and stderr are read line by line,
//!   so tests wait on real signals (a `listening on` line, a log line, an
//!   exit) and never on a sleep. Dropping it kills the process, and a failing
//!   test prints what each process wrote;
//! * [`Coord`] and [`worker`]: the two programs, started the way the tests
//!   need them (`--listen 127.0.0.1:0`, a data directory, debug logs);
//! * [`Report`]: a finished run's `report.json`, checked against the
//!   published totals (`nq_core::published`, OEIS A000170 and A002562);
//! * [`Pki`]: a CA and certificates made at run time for the TLS tests.
//!
//! For fault tests it also has:
//!
//! * [`proxy`]: a TCP proxy that drops or stalls a worker's traffic;
//! * [`client`]: a worker driven call by call, to send forged or wrong
//!   reports (and the base of the `nq-liar` test double);
//! * [`rng`]: seeded randomness for fault moments, replayable by seed;
//! * [`reliability`]: the catalogue of injected faults and the rows that
//!   `RELIABILITY.md` is generated from.
//!
//! # Layout
//!
//! The process harness is in this file, the fault-test tools in the modules
//! above. `src/bin/nq-loadtest/` is the load-test tool, `src/bin/nq-liar.rs`
//! a worker that reports wrong counts, and `src/bin/nq-reliability.rs` renders
//! `RELIABILITY.md`.

#![deny(missing_docs)]

pub mod client;
pub mod proxy;
pub mod reliability;
pub mod rng;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The target directory and cargo profile of the running executable: tests run
/// from `target/<profile>/deps/`, binaries from `target/<profile>/`.
fn target_and_profile() -> Result<(PathBuf, String)> {
    let exe = std::env::current_exe().context("cannot locate the running executable")?;
    let mut dir = exe.parent().context("executable has no directory")?;
    if dir.file_name().is_some_and(|d| d == "deps") {
        dir = dir.parent().context("deps has no parent")?;
    }
    let profile_dir = dir
        .file_name()
        .and_then(|p| p.to_str())
        .context("profile directory is not UTF-8")?;
    // Cargo puts the `dev` and `test` profiles in `debug/`.
    let profile = match profile_dir {
        "debug" => "dev",
        other => other,
    }
    .to_owned();
    let target = dir.parent().context("profile directory has no parent")?;
    Ok((target.to_owned(), profile))
}

/// The path of workspace binary `name` (`nq-coord`, `nq-worker`), built with
/// the running executable's profile and target directory.
///
/// The first call runs `cargo build -p nq-coord -p nq-worker` once per
/// process (a no-op when they are up to date), so `cargo test -p nq-e2e` never
/// runs stale binaries. `cargo test --workspace` has built them already.
///
/// # Errors
///
/// When cargo cannot be run or the build fails.
pub fn binary(name: &str) -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let dir = BUILT
        .get_or_init(|| build_binaries().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))?;
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        bail!("{} was not built", path.display());
    }
    Ok(path)
}

fn build_binaries() -> Result<PathBuf> {
    let (target, profile) = target_and_profile()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut command = std::process::Command::new(cargo);
    // Cargo runs this test with variables that describe nq-e2e
    // (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, ...). Build scripts watch some of
    // them (ring's `rerun-if-env-changed=CARGO_PKG_NAME`), so a nested build
    // that inherits them reruns those scripts, recompiles ring, rustls and
    // tonic, and makes the next `cargo test` recompile them back: a minute
    // or more of every test run, spent inside the first test's deadline.
    for (key, _) in std::env::vars_os() {
        if let Some(k) = key.to_str()
            && (k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_MANIFEST_")
                || matches!(
                    k,
                    "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                        | "OUT_DIR"
                ))
        {
            command.env_remove(&key);
        }
    }
    let status = command
        .args([
            "build",
            "--quiet",
            "-p",
            "nq-coord",
            "-p",
            "nq-worker",
            "--profile",
        ])
        .arg(&profile)
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .context("cannot run cargo to build nq-coord and nq-worker")?;
    if !status.success() {
        bail!(
            "`cargo build -p nq-coord -p nq-worker --profile {profile}` failed: {status}"
        );
    }
    let dir = match profile.as_str() {
        "dev" | "test" => "debug",
        "bench" => "release",
        other => other,
    };
    Ok(target.join(dir))
}

/// Which output of a process a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipe {
    /// Standard output.
    Stdout,
    /// Standard error (the logs).
    Stderr,
}

/// A child process whose output is read line by line.
///
/// Dropping it kills the process (SIGKILL) and, if the thread is panicking,
/// prints everything the process wrote, so a failing test shows why.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    /// Lines as they arrive; closed when both pipes are closed.
    lines: mpsc::UnboundedReceiver<(Pipe, String)>,
    /// Every line seen, for [`Proc::output`] and failure reports.
    log: Arc<Mutex<Vec<String>>>,
    /// Lines read from `lines` but not consumed by a wait.
    seen: VecDeque<(Pipe, String)>,
    exit: Option<ExitStatus>,
}

impl Proc {
    /// Starts `program` with `args` and extra environment variables.
    ///
    /// # Errors
    ///
    /// When the process cannot be started.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let (tx, lines) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        tokio::spawn(pump(stdout, Pipe::Stdout, tx.clone(), Arc::clone(&log)));
        tokio::spawn(pump(stderr, Pipe::Stderr, tx, Arc::clone(&log)));
        Ok(Proc {
            name: name.to_owned(),
            child,
            lines,
            log,
            seen: VecDeque::new(),
            exit: None,
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits for the next line (from either pipe) for which `matches` holds,
    /// and returns it. Lines before it are skipped.
    ///
    /// # Errors
    ///
    /// When the process closes its output first; the error quotes the output.
    pub async fn line(&mut self, matches: impl Fn(Pipe, &str) -> bool) -> Result<String> {
        while let Some((pipe, line)) = match self.seen.pop_front() {
            Some(l) => Some(l),
            None => self.lines.recv().await,
        } {
            if matches(pipe, &line) {
                return Ok(line);
            }
        }
        bail!(
            "{} ended its output before the expected line:\n{}",
            self.name,
            self.output()
        )
    }

    /// Waits for a line containing `needle`.
    ///
    /// # Errors
    ///
    /// As [`Proc::line`].
    pub async fn line_containing(&mut self, needle: &str) -> Result<String> {
        self.line(|_, l| l.contains(needle)).await
    }

    /// Waits for the process to exit.
    ///
    /// # Errors
    ///
    /// When waiting fails.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.exit {
            return Ok(status);
        }
        let status = self.child.wait().await.context("wait failed")?;
        self.exit = Some(status);
        // Let the pumps deliver the last lines.
        while let Some(l) = self.lines.recv().await {
            self.seen.push_back(l);
        }
        Ok(status)
    }

    /// Waits for the process to exit and fails unless it exited with 0.
    ///
    /// # Errors
    ///
    /// On a non-zero exit, quoting the output.
    pub async fn success(&mut self) -> Result<()> {
        let status = self.wait().await?;
        if !status.success() {
            bail!("{} exited with {status}:\n{}", self.name, self.output());
        }
        Ok(())
    }

    /// Sends SIGKILL and reaps the process.
    ///
    /// # Errors
    ///
    /// When the process cannot be killed.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await.context("kill failed")?;
        self.wait().await?;
        Ok(())
    }

    /// Sends SIGTERM (the polite stop that Docker and Kubernetes send).
    ///
    /// # Errors
    ///
    /// When the process is gone or the signal cannot be sent.
    pub fn terminate(&self) -> Result<()> {
        self.signal(libc::SIGTERM)
    }

    /// Sends signal `sig` (`libc::SIGSTOP`, `libc::SIGCONT`, ...).
    ///
    /// # Errors
    ///
    /// When the process is gone or the signal cannot be sent.
    pub fn signal(&self, sig: libc::c_int) -> Result<()> {
        let pid = self.pid().context("the process has exited")?;
        let pid = libc::pid_t::try_from(pid).context("pid out of range")?;
        // SAFETY: kill(2) with a valid signal number has no memory effects.
        if unsafe { libc::kill(pid, sig) } != 0 {
            bail!("kill -{sig} {pid}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Forgets the lines received but not yet waited for, so that the next
    /// wait sees only lines written from about now on (a line still in the
    /// pipe may remain: the process wrote it a moment ago).
    pub fn skip_backlog(&mut self) {
        self.seen.clear();
        while self.lines.try_recv().is_ok() {}
    }

    /// A handle on this process's output that outlives it, for reports made
    /// after the process (or the future that owned it) is gone.
    pub fn output_handle(&self) -> OutputHandle {
        OutputHandle {
            name: self.name.clone(),
            log: Arc::clone(&self.log),
        }
    }

    /// Every line so far that contains `needle`.
    pub fn lines_containing(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// Everything the process wrote so far, one line per line, stderr and
    /// stdout interleaved in arrival order.
    pub fn output(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }
}

/// A shared view of a [`Proc`]'s output (see [`Proc::output_handle`]).
#[derive(Clone, Debug)]
pub struct OutputHandle {
    name: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl OutputHandle {
    /// The process's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its last `n` lines (all of them when fewer), one per line.
    pub fn tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log[log.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // `kill_on_drop` kills the child; this only reports.
        if std::thread::panicking() {
            eprintln!("----- output of {} -----\n{}", self.name, self.output());
        }
    }
}

async fn pump(
    pipe: impl AsyncRead + Unpin,
    which: Pipe,
    tx: mpsc::UnboundedSender<(Pipe, String)>,
    log: Arc<Mutex<Vec<String>>>,
) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        log.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line.clone());
        // The receiver may be gone (process dropped); keep draining the pipe
        // so the child never blocks on a full pipe.
        let _ = tx.send((which, line));
    }
}

/// The environment of every process the harness starts: logs that tests read
/// (the worker's per-job events are at debug level), without colour codes.
pub const LOG_ENV: &[(&str, &str)] = &[
    ("RUST_LOG", "info,nq_worker=debug,nq_coord=debug"),
    ("NO_COLOR", "1"),
];

/// The flags of a coordinator driven by hand-written protocol clients
/// ([`crate::client::ProtocolWorker`]): N = 12, no local threads, no
/// verification (so that any confirmation comes from a report that should
/// have been refused), and a short linger, because hand-driven workers never
/// ask whether the run is over.
pub const HAND_DRIVEN: &[&str] = &[
    "--n",
    "12",
    "--local-threads",
    "0",
    "--verify",
    "0",
    "--linger",
    "1s",
];

/// A running `nq-coord` process.
#[derive(Debug)]
pub struct Coord {
    /// The process.
    pub proc: Proc,
    /// Where it listens, from its `listening on` line.
    pub addr: SocketAddr,
    /// Its data directory.
    pub dir: PathBuf,
}

impl Coord {
    /// Starts `nq-coord --data DIR --listen LISTEN ARGS…` and waits for its
    /// `listening on <addr>` line.
    ///
    /// # Errors
    ///
    /// When it cannot start or exits before listening (the error quotes its
    /// output).
    pub async fn start(dir: &Path, listen: &str, args: &[&str]) -> Result<Coord> {
        Coord::start_with_env(dir, listen, args, LOG_ENV).await
    }

    /// [`Coord::start`] with the environment `env` instead of [`LOG_ENV`]
    /// (the load test runs the coordinator with production logging: its
    /// per-job debug lines would cost it time).
    ///
    /// # Errors
    ///
    /// As [`Coord::start`].
    pub async fn start_with_env(
        dir: &Path,
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Coord> {
        let data = dir.display().to_string();
        let mut all = vec!["--data", &data, "--listen", listen];
        all.extend_from_slice(args);
        Coord::spawn(dir, &all, env).await
    }

    /// Starts `nq-coord ARGS…` with exactly the arguments `args` (a
    /// configuration file may name the data directory and the address) and
    /// the environment `env`, and waits for its `listening on <addr>` line;
    /// `dir` is the data directory the arguments name.
    ///
    /// # Errors
    ///
    /// As [`Coord::start`].
    pub async fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Coord> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let mut proc = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, env)?;
        let line = proc
            .line(|pipe, l| pipe == Pipe::Stdout && l.starts_with("listening on "))
            .await?;
        let addr = line["listening on ".len()..]
            .trim()
            .parse()
            .with_context(|| format!("bad readiness line {line:?}"))?;
        Ok(Coord {
            proc,
            addr,
            dir: dir.to_owned(),
        })
    }

    /// Starts a coordinator on an ephemeral loopback port.
    ///
    /// # Errors
    ///
    /// As [`Coord::start`].
    pub async fn ephemeral(dir: &Path, args: &[&str]) -> Result<Coord> {
        Coord::start(dir, "127.0.0.1:0", args).await
    }

    /// Waits for a clean exit and returns `DIR/report.json`.
    ///
    /// # Errors
    ///
    /// On a non-zero exit or a missing or invalid report.
    pub async fn finish(&mut self) -> Result<Report> {
        self.proc.success().await?;
        Report::read(&self.dir)
    }

    /// Waits for the exit of a run whose jobs a lone remote worker computed
    /// (`--local-threads 0`): no second machine could check them, so the run
    /// ends as `unchecked`, exit code 6 (issue 15, item 7), and its totals
    /// must still be the published ones. Returns `DIR/report.json`.
    ///
    /// # Errors
    ///
    /// On another exit code, or as [`Report::check_unchecked`].
    pub async fn finish_unchecked(&mut self) -> Result<Report> {
        let status = self.proc.wait().await?;
        if status.code() != Some(6) {
            bail!(
                "{} exited with {status}, not 6 (unchecked):\n{}",
                self.proc.name,
                self.proc.output()
            );
        }
        let report = Report::read(&self.dir)?;
        report.check_unchecked()?;
        Ok(report)
    }
}

/// The fields of `DIR/report.json` the tests check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Board size.
    pub n: u32,
    /// Q(n).
    pub total: u128,
    /// U(n).
    pub unique: u128,
    /// Jobs in the run.
    pub jobs: u64,
    /// Whether the totals equal the published ones.
    pub published_match: Option<bool>,
    /// Results that disagreed with an earlier result for the same job.
    pub conflicts: u64,
    /// The whole document.
    pub json: serde_json::Value,
}

impl Report {
    /// The entries of `faulty_workers` (each with `name`, `address`, `lost`
    /// and `banned`).
    ///
    /// # Errors
    ///
    /// When report.json has no such list.
    pub fn faulty_workers(&self) -> Result<&Vec<serde_json::Value>> {
        self.json
            .get("faulty_workers")
            .and_then(|f| f.as_array())
            .with_context(|| {
                format!("report.json has no faulty_workers list: {}", self.json)
            })
    }

    /// Reads `dir/report.json`. The counts are exact JSON integers.
    ///
    /// # Errors
    ///
    /// When the file is missing or a field is absent or not an integer.
    pub fn read(dir: &Path) -> Result<Report> {
        let path = dir.join("report.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        // Without serde_json's arbitrary_precision, integers beyond u64 parse
        // as floats; those fail here instead of rounding (every published
        // count fits in u64).
        let int = |field: &str| -> Result<u128> {
            let v = json
                .get(field)
                .with_context(|| format!("report.json lacks `{field}`: {text}"))?;
            v.as_u64().map(u128::from).with_context(|| {
                format!("report.json `{field}` is not an exact integer: {v}")
            })
        };
        Ok(Report {
            n: u32::try_from(int("n")?)?,
            total: int("total")?,
            unique: int("unique")?,
            jobs: u64::try_from(int("jobs")?)?,
            published_match: json.get("published_match").and_then(|v| v.as_bool()),
            conflicts: u64::try_from(int("conflicts")?)?,
            json,
        })
    }

    /// Fails unless the run ended `unchecked` (issue 15, item 7: a lone
    /// remote worker's run, which no second machine checked), with unchecked
    /// jobs, no conflict, and the published totals.
    ///
    /// # Errors
    ///
    /// Naming what differs.
    pub fn check_unchecked(&self) -> Result<()> {
        if self.json["status"] != "unchecked"
            || self.json["exit_code"] != 6
            || self.json["unchecked"].as_u64().is_none_or(|u| u == 0)
        {
            bail!("report.json does not say unchecked: {}", self.json);
        }
        if self.conflicts != 0 {
            bail!("n={}: {} conflicting results", self.n, self.conflicts);
        }
        let n = u8::try_from(self.n)?;
        let (q, u) = nq_core::published::published(n)
            .with_context(|| format!("no published value for N={n}"))?;
        if (self.total, self.unique) != (q, u) || self.published_match != Some(true) {
            bail!(
                "n={n}: got {} / {}, published {q} / {u}",
                self.total,
                self.unique
            );
        }
        Ok(())
    }

    /// Fails unless the totals are the published ones and nothing conflicted.
    ///
    /// # Errors
    ///
    /// Naming the wrong value.
    pub fn check_published(&self) -> Result<()> {
        self.check_exact()?;
        if self.conflicts != 0 {
            bail!("n={}: {} conflicting results", self.n, self.conflicts);
        }
        Ok(())
    }

    /// Fails unless the run is complete and its totals are the published
    /// ones. Conflicting results are allowed (a run with a lying worker has
    /// them, recorded and not counted); [`Report::check_published`] forbids
    /// them.
    ///
    /// # Errors
    ///
    /// Naming the wrong value.
    pub fn check_exact(&self) -> Result<()> {
        // `status` and `exit_code` are absent from reports of coordinators
        // before issue 7; when present they must say "complete" and 0.
        if let Some(status) = self.json.get("status")
            && status != "complete"
        {
            bail!(
                "report.json status is {status}, not \"complete\": {}",
                self.json
            );
        }
        if let Some(code) = self.json.get("exit_code")
            && code != 0
        {
            bail!("report.json exit_code is {code}, not 0: {}", self.json);
        }
        let n = u8::try_from(self.n)?;
        let (q, u) = nq_core::published::published(n)
            .with_context(|| format!("no published value for N={n}"))?;
        if (self.total, self.unique) != (q, u) {
            bail!(
                "n={}: got total {} unique {}, published {q} / {u}",
                self.n,
                self.total,
                self.unique
            );
        }
        if self.published_match == Some(false) {
            bail!("report.json says published_match = false: {}", self.json);
        }
        Ok(())
    }
}

/// Starts `nq-worker --connect ADDR ARGS…` with debug logs.
///
/// # Errors
///
/// When the process cannot start.
pub fn worker(name: &str, connect: &str, args: &[&str]) -> Result<Proc> {
    let mut all = vec![
        "--connect".to_owned(),
        connect.to_owned(),
        "--name".to_owned(),
        name.to_owned(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    Proc::spawn(name, &binary("nq-worker")?, &all, LOG_ENV)
}

/// Runs `ip ARGS…` (iproute2), for the tests that make network namespaces.
///
/// # Errors
///
/// When `ip` cannot run, or fails (its stderr is in the message).
pub fn ip(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip`: install iproute2 (apt-get install iproute2)")?;
    anyhow::ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// A loopback address with a port that was free a moment ago: bind an
/// ephemeral port, then release it. For processes that must be told a port
/// before anything listens on it.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// Runs `fut` under a deadline, naming what timed out.
///
/// # Errors
///
/// The future's error, or a timeout.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| anyhow!("{what}: timed out after {limit:?}"))?
}

/// Certificates made at run time (rcgen) for the TLS tests, as PEM files: a
/// CA, a server certificate for `localhost` and `127.0.0.1`, and a client
/// certificate, both signed by the CA.
#[derive(Debug)]
pub struct Pki {
    /// The CA certificate: what workers trust (`--ca`) and what a mutual-TLS
    /// coordinator requires of clients (`--tls-client-ca`).
    pub ca: PathBuf,
    /// The coordinator's certificate (`--tls-cert`).
    pub server_cert: PathBuf,
    /// Its key (`--tls-key`).
    pub server_key: PathBuf,
    /// A worker's certificate, for mutual TLS.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

impl Pki {
    /// Makes the CA and both certificates and writes them into `dir`.
    ///
    /// # Errors
    ///
    /// When a certificate cannot be made or a file cannot be written.
    pub fn create(dir: &Path) -> Result<Pki> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType,
            ExtendedKeyUsagePurpose, IsCa, KeyPair,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "nq test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| -> Result<_> {
            let mut params = CertificateParams::new(names)?;
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &ca)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) =
            leaf(vec!["worker".into()], ExtendedKeyUsagePurpose::ClientAuth)?;
        let write = |name: &str, pem: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        };
        Ok(Pki {
            ca: write("ca.pem", &ca.pem())?,
            server_cert: write("server.pem", &server_cert)?,
            server_key: write("server.key", &server_key)?,
            client_cert: write("client.pem", &client_cert)?,
            client_key: write("client.key", &client_key)?,
        })
    }
}

/// The value of field `key` in a log line of the `tracing` text format
/// (`... message key=value other=value`), or in its span prefix
/// (`span{key=value}:`); the last occurrence wins, so an event's own field
/// beats a span's. Values end at a space, a comma or a closing brace.
pub fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!("{key}=");
    line.match_indices(&pattern)
        .filter(|(i, _)| {
            // A whole field name: preceded by a separator, not a longer name.
            *i == 0 || matches!(line.as_bytes()[i - 1], b' ' | b'{' | b',')
        })
        .last()
        .map(|(i, _)| {
            let rest = &line[i + pattern.len()..];
            let end = rest.find([' ', '}', ',']).unwrap_or(rest.len());
            rest[..end].trim_matches('"')
        })
}

#[cfg(test)]
mod tests {
    use super::log_field;

    #[test]
    fn log_fields_are_read_whole() {
        let line = "2026 WARN report{worker=w1.10 job=3}: nq_coord::run: lease expired \
                    job=5 lease=42 worker=w1.1";
        assert_eq!(log_field(line, "worker"), Some("w1.1"));
        assert_eq!(log_field(line, "job"), Some("5"));
        assert_eq!(log_field(line, "lease"), Some("42"));
        assert_eq!(log_field(line, "ease"), None);
        assert_eq!(log_field("x{worker=w2.0}: y", "worker"), Some("w2.0"));
    }
}
