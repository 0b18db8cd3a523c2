//! The `nq-coord` binary: parses the command line, sets up logging and the
//! progress display, builds the [`Config`] and calls [`nq_coord::run`] (or
//! [`nq_coord::export::export`]). Nothing else happens here.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nq_coord::config::{parse_duration, parse_split};
use nq_coord::export::{ExportOptions, export};
use nq_coord::{Config, Progress};
use nq_core::pool::MAX_THREADS;
use nq_process::output::{stderr_line, stdout_line};
use tokio::sync::watch;
use tracing_subscriber::fmt::MakeWriter;

/// Counts N-Queens solutions exactly: splits the board into jobs, runs them on
/// this machine's cores and on any `nq-worker` that connects, and keeps the
/// run in a data directory so that it survives restarts.
///
/// Prints `listening on ADDR` on stdout once bound, then one result line:
/// `n=N status=complete total=Q unique=U seconds=S jobs=J conflicts=C
/// audit=sha256:HEX published=match|MISMATCH|unknown` (or `status=interrupted
/// ...`). `audit` is the digest that ends `nq-coord audit`'s output.
///
/// Every flag can also be set from the environment variable shown with it
/// (`NQ_N=12 NQ_DATA=/scratch/nq-12 nq-coord` runs like `nq-coord --n 12
/// --data /scratch/nq-12`); a flag on the command line wins.
#[derive(Parser, Debug)]
#[command(name = "nq-coord", version, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    log: nq_process::LogArgs,
}

/// Flags of a run.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Board size N, 1 to 32. Required unless a subcommand is given.
    #[arg(long, value_name = "N", env = "NQ_N")]
    n: Option<u64>,
    /// Address to serve workers on, HOST:PORT. Port 0 picks a free port; the
    /// address actually bound is printed as `listening on ADDR` on stdout.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "0.0.0.0:50051",
        env = "NQ_LISTEN"
    )]
    listen: String,
    /// Data directory, holding one run; created if missing, resumed if it
    /// holds this run, refused if it holds another. Default: `nq-N.sled` (or
    /// `nq-N-solutions.sled` with --solutions) in the working directory.
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    data: Option<PathBuf>,
    /// Threads that run jobs inside the coordinator, 0 to 4096; 0 only serves
    /// remote workers. Default: every core.
    #[arg(long, value_name = "T", env = "NQ_LOCAL_THREADS", value_parser = local_threads_parser())]
    local_threads: Option<usize>,
    /// How to split the board, RING:EXTRA: 0 for the border split or a ring
    /// depth 1 to 3 (the Q27 ring split), then 0 to 8 extra columns. Default
    /// for a new run: the border split with the fewest extra columns that give
    /// a quarter of the target jobs (0:0 up to N = 18, 0:1 at N = 19 to 23).
    /// When resuming, the
    /// stored split (giving another one is refused).
    #[arg(long, value_name = "RING:EXTRA", env = "NQ_SPLIT")]
    split: Option<String>,
    /// Store every solution (workers stream them), for `nq-coord export`.
    #[arg(long, env = "NQ_SOLUTIONS")]
    solutions: bool,
    /// Lease lifetime: a worker silent for this long loses its jobs to others.
    /// A number with a unit: 500ms, 30s, 2m.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "30s",
        env = "NQ_LEASE_TTL"
    )]
    lease_ttl: String,
    /// Target number of jobs for a new run (sub-problems are grouped into about
    /// this many jobs of equal estimated work; a K at least the number of
    /// sub-problems gives one sub-problem per job). Default: 256 up to N = 16,
    /// doubling with each larger N. Ignored when resuming.
    #[arg(long, value_name = "K", env = "NQ_JOBS")]
    jobs: Option<u64>,
    /// At most S sub-problems per job, 1 to 4096 (the default). `--job-size 1`
    /// makes one job per sub-problem (e.g. a million jobs for a load test with
    /// `--n 22 --split 0:3`). Ignored when resuming.
    #[arg(long, value_name = "S", env = "NQ_JOB_SIZE")]
    job_size: Option<usize>,
    /// After the last job, how long at most to keep telling workers that the
    /// run is over. The coordinator leaves as soon as every worker heard it;
    /// the cap matters only for a worker busy on a last job [default: a third
    /// of --lease-ttl plus 1s, so a busy worker's heartbeat is not missed].
    #[arg(long, value_name = "DURATION", env = "NQ_LINGER")]
    linger: Option<String>,
    /// sled page cache, in MiB (its real memory use is a few times this).
    #[arg(long, value_name = "MIB", default_value_t = 16, env = "NQ_CACHE_MIB")]
    cache_mib: u64,
    /// Progress display on stderr: a bar when stderr is a terminal and log
    /// lines otherwise (auto), or always one of them, or none.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto, env = "NQ_PROGRESS")]
    progress: ProgressMode,
    /// Interval between progress log lines.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        env = "NQ_PROGRESS_INTERVAL"
    )]
    progress_interval: String,
    /// Share of jobs computed a second time by a different worker (on another
    /// kernel where it can) and compared: `auto`, or 0 to 1 (`0.05`, `5%`).
    /// A disagreement goes to a third computation, and the majority counts.
    /// `auto` checks 2% of the jobs once any remote worker takes part, and
    /// none in a run on this machine's threads alone. `1` computes
    /// everything twice.
    #[arg(long, value_name = "SHARE", env = "NQ_VERIFY", default_value = "auto")]
    verify: String,
    /// Refuse a worker's calls once it lost this many verification conflicts
    /// (its results disagreed with the majority). One lost conflict already
    /// makes every result it computed alone be computed again by others.
    #[arg(
        long,
        value_name = "K",
        env = "NQ_BAN_AFTER",
        default_value_t = nq_coord::quorum::DEFAULT_BAN_AFTER
    )]
    ban_after: u32,
    /// Serve an HTTP port at HOST:PORT with Prometheus metrics (`/metrics`),
    /// the run's status as JSON (`/status.json`) and a status page (`/`).
    /// Port 0 picks a free port; the address bound is printed as `metrics on
    /// ADDR` on stdout. Anyone who reaches it sees the workers' names and
    /// addresses: bind it to a private address.
    #[arg(long, value_name = "ADDR", env = "NQ_METRICS")]
    metrics: Option<String>,
    #[command(flatten)]
    security: SecurityArgs,
}

/// Who may join the run. Without --token and TLS, anyone who reaches the
/// port can; the coordinator says so loudly when it listens beyond loopback.
#[derive(clap::Args, Debug, Default)]
struct SecurityArgs {
    /// Shared secret that every worker must send (`authorization: Bearer
    /// TOKEN`); calls without it get UNAUTHENTICATED and are logged with the
    /// caller's address. The gRPC health and reflection services stay open
    /// (container probes, `grpcurl list`). Prefer the environment variable:
    /// a command line is visible to every user of the machine.
    #[arg(long, value_name = "TOKEN", env = "NQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Serve TLS with this certificate chain (PEM), with --tls-key.
    #[arg(long, value_name = "PEM", env = "NQ_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, RSA or EC).
    #[arg(long, value_name = "PEM", env = "NQ_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: require every client to present a certificate signed by
    /// this CA (PEM). Needs --tls-cert and --tls-key.
    #[arg(
        long,
        value_name = "PEM",
        env = "NQ_TLS_CLIENT_CA",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,
}

impl SecurityArgs {
    /// Reads and checks the token and the TLS files into `config`.
    fn apply(&self, config: &mut Config) -> anyhow::Result<()> {
        config.token = self
            .token
            .as_deref()
            .map(nq_proto::auth::Token::new)
            .transpose()
            .context("invalid --token (or NQ_TOKEN)")?;
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            config.tls = Some(nq_proto::tls::ServerTls::load(
                cert,
                key,
                self.tls_client_ca.as_deref(),
            )?);
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProgressMode {
    Auto,
    Bar,
    Log,
    None,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Writes every solution stored by a --solutions run (or, with --unique,
    /// one per symmetry class) to stdout or a file, one per line, in store
    /// order. On an unfinished run it writes the solutions of the jobs done so
    /// far and warns.
    Export(ExportArgs),
    /// Asks a running coordinator whether it serves workers (the standard
    /// `grpc.health.v1` check of the `nqueens.v1.Coordinator` service) and
    /// exits 0 if it does. A container healthcheck: "serving" means the run
    /// is loaded and jobs are handed out, not merely that the port is open.
    Health(HealthArgs),
    /// Writes every job's result, the workers that computed it, when, and how
    /// it was verified, as CSV (to stdout or --output); then adds all counted
    /// results up again from their stored counts and compares the totals with
    /// the stored ones. Exits non-zero on any difference or damaged record.
    ///
    /// The CSV (format `nq-audit v2`) also names the board, the split and
    /// each job's sub-problems, and ends with its own SHA-256, the `audit=`
    /// of the run's final line: `nq recheck` re-computes a sample of it.
    Audit(AuditArgs),
    /// Asks a running coordinator where its run stands (the `Status` rpc):
    /// N, progress by estimated work, ETA, rates, the workers with their
    /// throughput and when each was last seen, conflicts, and the result
    /// once known. Text for people, or --json for scripts.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// The coordinator: `host`, `host:port`, `http://host:port` or
    /// `https://host:port` (port 50051 when left out).
    #[arg(
        long,
        value_name = "HOST[:PORT]",
        default_value = "127.0.0.1:50051",
        env = "NQ_CONNECT"
    )]
    connect: String,
    /// Print the status as one JSON document (counts as decimal strings).
    #[arg(long, env = "NQ_STATUS_JSON")]
    json: bool,
    /// Give up after this long (connection and answer).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5s",
        env = "NQ_STATUS_TIMEOUT"
    )]
    timeout: String,
    #[command(flatten)]
    dial: Dial,
}

/// How a subcommand reaches a running coordinator that requires TLS or a
/// token (the Status rpc needs the token like any worker call; health does
/// not).
#[derive(clap::Args, Debug)]
struct Dial {
    /// Speak TLS, trusting this CA (PEM) for the coordinator's certificate.
    #[arg(long, value_name = "PEM", env = "NQ_CA")]
    ca: Option<PathBuf>,
    /// Client certificate (PEM), for a coordinator that requires one
    /// (--tls-client-ca); with --tls-key and --ca.
    #[arg(
        long,
        value_name = "PEM",
        env = "NQ_TLS_CERT",
        requires = "tls_key",
        requires = "ca"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM", env = "NQ_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The coordinator's token (`--token` / `NQ_TOKEN` of the run).
    #[arg(long, value_name = "TOKEN", env = "NQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl Dial {
    /// The endpoint of `connect` (TLS with `--ca` or an `https://` address)
    /// and the interceptor that sends the token.
    fn endpoint(
        &self,
        connect: &str,
        timeout: Duration,
    ) -> anyhow::Result<(tonic::transport::Endpoint, nq_proto::auth::Bearer)> {
        let tls = self.ca.is_some() || connect.starts_with("https://");
        let mut endpoint = coordinator_endpoint(connect, timeout, tls)?;
        if let Some(ca) = &self.ca {
            let config = nq_proto::tls::ClientTls::load(
                Some(ca),
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
            )?;
            endpoint = endpoint.tls_config(config.config()).with_context(|| {
                format!("cannot use TLS towards --connect {connect:?}")
            })?;
        }
        let token = self
            .token
            .as_deref()
            .map(nq_proto::auth::Token::new)
            .transpose()
            .context("invalid --token (or NQ_TOKEN)")?;
        Ok((endpoint, nq_proto::auth::Bearer(token)))
    }
}

#[derive(clap::Args, Debug)]
struct AuditArgs {
    /// The run's data directory (the coordinator must not be running on it).
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    data: PathBuf,
    /// Write the CSV to this file instead of stdout.
    #[arg(long, value_name = "FILE", env = "NQ_AUDIT_OUTPUT")]
    output: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct HealthArgs {
    /// The coordinator, HOST:PORT.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:50051",
        env = "NQ_CONNECT"
    )]
    connect: String,
    /// Give up after this long (connection and answer).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "2s",
        env = "NQ_HEALTH_TIMEOUT"
    )]
    timeout: String,
    /// TLS and token; the health service needs no token, but a proxy in
    /// front of the coordinator may.
    #[command(flatten)]
    dial: Dial,
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    /// The run's data directory.
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    data: PathBuf,
    /// Only one solution per class of the 8 symmetries, in canonical form.
    #[arg(long, env = "NQ_EXPORT_UNIQUE")]
    unique: bool,
    /// Notation: vector ([1 3 0 2]), digits (2413, N ≤ 9), algebraic
    /// (a2 b4 c1 d3), json, string, board.
    #[arg(
        long,
        value_name = "F",
        default_value = "vector",
        env = "NQ_EXPORT_FORMAT"
    )]
    format: String,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE", env = "NQ_EXPORT_OUTPUT")]
    output: Option<PathBuf>,
}

impl TryFrom<RunArgs> for Config {
    type Error = nq_coord::Error;

    fn try_from(a: RunArgs) -> Result<Config, nq_coord::Error> {
        let n = a.n.ok_or(nq_coord::Error::Option {
            option: "--n",
            value: "(missing)".into(),
            accepted: "given: the board size, 1 to 32",
        })?;
        let data = a
            .data
            .unwrap_or_else(|| Config::default_data_dir(n, a.solutions));
        let mut config = Config::new(n, data)?;
        config.split = a.split.as_deref().map(parse_split).transpose()?;
        config.solutions = a.solutions;
        config.local_threads = a.local_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        });
        config.lease_ttl = parse_duration(&a.lease_ttl)?;
        if let Some(k) = a.jobs {
            if k == 0 {
                return Err(nq_coord::Error::Option {
                    option: "--jobs",
                    value: k.to_string(),
                    accepted: "at least 1",
                });
            }
            config.target_jobs = Some(k);
        }
        if let Some(size) = a.job_size {
            if !(1..=nq_coord::MAX_SUBS_PER_JOB).contains(&size) {
                return Err(nq_coord::Error::Option {
                    option: "--job-size",
                    value: size.to_string(),
                    accepted: "1 to 4096",
                });
            }
            config.max_job_size = size;
        }
        config.linger = match &a.linger {
            Some(linger) => parse_duration(linger)?,
            None => nq_coord::config::default_linger(config.lease_ttl),
        };
        if a.cache_mib == 0 {
            return Err(nq_coord::Error::Option {
                option: "--cache-mib",
                value: "0".into(),
                accepted: "at least 1",
            });
        }
        config.cache_bytes = a.cache_mib.saturating_mul(1 << 20);
        config.verify = nq_coord::config::parse_verify(&a.verify)?;
        if a.ban_after == 0 {
            return Err(nq_coord::Error::Option {
                option: "--ban-after",
                value: "0".into(),
                accepted: "at least 1",
            });
        }
        config.ban_after = a.ban_after;
        config.progress_log = match a.progress {
            ProgressMode::Log => Some(parse_duration(&a.progress_interval)?),
            ProgressMode::Auto if !std::io::stderr().is_terminal() => {
                Some(parse_duration(&a.progress_interval)?)
            }
            _ => None,
        };
        Ok(config)
    }
}

fn main() -> ExitCode {
    tune_malloc();
    let args = Args::parse();
    let bar = match (&args.command, args.run.progress) {
        (None, ProgressMode::Bar) => Some(new_bar()),
        (None, ProgressMode::Auto) if std::io::stderr().is_terminal() => Some(new_bar()),
        _ => None,
    };
    // Logs go to stderr, through the progress bar when there is one (so lines
    // do not tear it).
    nq_process::logging::init_with_writer(args.log, BarWriter(bar.clone()));
    let result = match args.command {
        Some(Command::Export(e)) => run_export(e).map(|()| 0),
        Some(Command::Health(h)) => run_health(h).map(|()| 0),
        Some(Command::Audit(a)) => run_audit(a).map(|()| 0),
        Some(Command::Status(a)) => run_status(a).map(|()| 0),
        None => run_coordinator(args.run, bar),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e)
            if matches!(
                e.downcast_ref::<nq_coord::Error>(),
                Some(nq_coord::Error::CreationInterrupted)
            ) =>
        {
            // Interrupted like a run stopped midway: resume to finish.
            nq_process::logging::fatal("nq-coord", format_args!("{e:#}"));
            ExitCode::from(nq_coord::report::RunStatus::Interrupted.exit_code())
        }
        Err(e) => {
            nq_process::logging::fatal("nq-coord", format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Local thread counts from 0 to nq-core's cap, the rule `nq count` and
/// `nq-worker --threads` follow too.
fn local_threads_parser() -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::TypedValueParser;
    clap::value_parser!(u64)
        .range(0..=MAX_THREADS as u64)
        .map(|t| t as usize)
}

/// `nq-coord health`: one `grpc.health.v1` check; an error unless SERVING.
fn run_health(args: HealthArgs) -> anyhow::Result<()> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let timeout = parse_duration(&args.timeout)?;
    let (endpoint, bearer) = args.dial.endpoint(&args.connect, timeout)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("no coordinator answers at {}", args.connect))?;
        let request = HealthCheckRequest {
            service: nq_proto::pb::coordinator_server::SERVICE_NAME.to_owned(),
        };
        let status = HealthClient::with_interceptor(channel, bearer)
            .check(request)
            .await
            .with_context(|| format!("the health check of {} failed", args.connect))?
            .into_inner()
            .status();
        match status {
            ServingStatus::Serving => {
                stdout_line("SERVING")?;
                Ok(())
            }
            // Before the run is loaded, and while it drains.
            other => anyhow::bail!(
                "the coordinator at {} is not serving workers: {}",
                args.connect,
                other.as_str_name()
            ),
        }
    })
}

/// The gRPC endpoint of a coordinator given as `HOST[:PORT]` (port 50051
/// when left out), with `timeout` on connecting and on each call.
fn coordinator_endpoint(
    connect: &str,
    timeout: Duration,
    tls: bool,
) -> anyhow::Result<tonic::transport::Endpoint> {
    // The forms `nq-worker --connect` takes: `host`, `host:port`,
    // `http://host[:port]`, `https://host[:port]`.
    let bare = connect
        .strip_prefix("https://")
        .or_else(|| connect.strip_prefix("http://"))
        .unwrap_or(connect);
    let authority = with_default_port(bare.strip_suffix('/').unwrap_or(bare), 50051);
    let scheme = if tls { "https" } else { "http" };
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("{scheme}://{authority}"))
            .with_context(|| {
                format!(
                    "invalid --connect {connect:?}: expected host, host:port, \
                 http://host:port or https://host:port, such as 127.0.0.1:50051"
                )
            })?;
    Ok(endpoint.connect_timeout(timeout).timeout(timeout))
}

/// `addr` with `:port` added when it names no port. A bare IPv6 address
/// gets brackets.
fn with_default_port(addr: &str, port: u16) -> String {
    if addr.parse::<SocketAddr>().is_ok() {
        return addr.to_owned();
    }
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return SocketAddr::new(ip, port).to_string();
    }
    match addr.rsplit_once(':') {
        Some((_, p)) if p.parse::<u16>().is_ok() => addr.to_owned(),
        _ => format!("{addr}:{port}"),
    }
}

/// `nq-coord status`: one `Status` call, printed as text or JSON.
fn run_status(args: StatusArgs) -> anyhow::Result<()> {
    use nq_proto::pb::coordinator_client::CoordinatorClient;

    let timeout = parse_duration(&args.timeout)?;
    let (endpoint, bearer) = args.dial.endpoint(&args.connect, timeout)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let answer = runtime.block_on(async {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("no coordinator answers at {}", args.connect))?;
        let answer = CoordinatorClient::with_interceptor(channel, bearer)
            .status(nq_proto::pb::StatusRequest {})
            .await
            .map_err(|s| match s.code() {
                tonic::Code::Unimplemented => anyhow::anyhow!(
                    "the coordinator at {} is too old to answer status requests",
                    args.connect
                ),
                _ => anyhow::anyhow!("status request to {} failed: {s}", args.connect),
            })?;
        anyhow::Ok(answer.into_inner())
    })?;
    let snapshot = nq_coord::status::Snapshot::try_from(answer).with_context(|| {
        format!(
            "the coordinator at {} sent a malformed status",
            args.connect
        )
    })?;
    let text = if args.json {
        format!("{}\n", snapshot.to_json())
    } else {
        snapshot.to_text()
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // `| head` is a normal way to read it.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}

/// Tunes glibc's malloc for a long-running coordinator whose memory must stay
/// bounded (a million-job run under 200 MB):
///
/// * at most 2 arenas (the default is 8 per core): every thread that
///   allocates (tokio workers, blocking threads, sled's pool) gets its own
///   arena, and memory freed across many arenas is not given back; with 1000
///   workers the cap saves about 50 MB, at no measurable cost in speed;
/// * a fixed 1 MiB mmap threshold (the default adapts upwards to 32 MiB), so
///   the large temporary vectors of a new run's split are returned to the
///   system when freed instead of staying in the heap.
///
/// Must run before any other thread starts.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// Parameters from glibc's `malloc.h`.
        const M_MMAP_THRESHOLD: i32 = -3;
        const M_ARENA_MAX: i32 = -8;
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: `mallopt` only tunes the allocator and is safe to call at
        // any time; an unknown parameter returns 0 and changes nothing.
        unsafe {
            mallopt(M_ARENA_MAX, 2);
            mallopt(M_MMAP_THRESHOLD, 1 << 20);
        }
    }
}

/// How often the coordinator hands freed heap memory back to the system.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Hands the heap's free memory back to the operating system every
/// [`TRIM_EVERY`]. sled allocates and frees a great deal while it reads a
/// large store (the creation's final re-scan, a resume's re-scan) and while
/// results stream in; glibc keeps what is freed in its arenas, so without
/// this the resident set stays at every peak and creeps up with
/// fragmentation. Measured on a 10^7-job run: see BENCHMARKS.md §7.
async fn trim_heap_periodically() {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    loop {
        tick.tick().await;
        // `malloc_trim` walks the arenas under their locks: off the async
        // threads.
        let _ = tokio::task::spawn_blocking(trim_heap).await;
    }
}

/// Returns free heap memory to the operating system (glibc only; a no-op
/// elsewhere).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: `malloc_trim` only releases free memory and is safe to call
        // from any thread at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// `nq-coord audit`: the CSV, then the re-added totals against the stored ones.
fn run_audit(args: AuditArgs) -> anyhow::Result<()> {
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let report =
        nq_coord::audit::audit(&args.data, &mut out, nq_coord::quorum::Fraction::Auto)?;
    out.flush().context("cannot write the audit")?;
    drop(out);
    let stored = |v: Option<u128>| {
        v.map_or("none (the run is not finished)".into(), |v| v.to_string())
    };
    stderr_line(format_args!(
        "nq-coord audit: {} of {} jobs settled; re-added total {} (stored {}), unique {} (stored {}); digest {}",
        report.settled,
        report.jobs,
        report.total,
        stored(report.stored_total),
        report.unique.map_or("-".into(), |u| u.to_string()),
        stored(report.stored_unique),
        report.digest,
    ));
    if !report.agrees() {
        bail!(
            "the re-added totals differ from the stored ones: the data directory \
             is damaged or was written by a faulty coordinator; do not trust its result"
        );
    }
    Ok(())
}

/// Runs the coordinator; returns the exit code of the run's status
/// (`RunStatus::exit_code`: 0 only for a complete run that matches the
/// published count where one is known).
fn run_coordinator(mut args: RunArgs, bar: Option<ProgressBar>) -> anyhow::Result<u8> {
    let listen = args.listen.clone();
    let security = std::mem::take(&mut args.security);
    let metrics = args.metrics.clone();
    let mut config = Config::try_from(args)?;
    security.apply(&mut config)?;
    let addr = resolve(&listen)?;
    if let Some(metrics) = metrics {
        config.http_listener = Some(bind_metrics(&metrics)?);
    }
    let runtime =
        tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let shutdown =
            nq_process::shutdown_signal().context("cannot install signal handlers")?;
        let trimmer = tokio::spawn(trim_heap_periodically());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let bound = listener
            .local_addr()
            .context("cannot read the bound address")?;
        // Tests and scripts wait for exactly this line.
        stdout_line(format_args!("listening on {bound}"))?;
        // Printed after `listening on`, which scripts wait for first.
        if let Some(http) = &config.http_listener {
            let bound = http
                .local_addr()
                .context("cannot read the bound --metrics address")?;
            stdout_line(format_args!("metrics on {bound}"))?;
        }
        let display = bar.map(|bar| {
            let (tx, rx) = watch::channel(Progress::default());
            config.progress = Some(tx);
            tokio::spawn(show_progress(bar, rx))
        });
        let report = nq_coord::run(config, listener, shutdown).await;
        trimmer.abort();
        let report = report?;
        if let Some(display) = display {
            let _ = display.await;
        }
        stdout_line(report.summary_line())?;
        let status = report.status();
        if status != nq_coord::report::RunStatus::Complete {
            stderr_line(format_args!(
                "nq-coord: {}: {}",
                status.as_str(),
                report.why()
            ));
        }
        Ok(status.exit_code())
    })
}

/// Binds the `--metrics` port (before the run starts, so that a bad address
/// fails at once).
fn bind_metrics(addr: &str) -> anyhow::Result<std::sync::Arc<std::net::TcpListener>> {
    let parsed = match addr.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => match addr.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(a)) => a,
            _ => bail!(
                "invalid --metrics address {addr:?}: expected HOST:PORT, such as \
                 127.0.0.1:9464 or 0.0.0.0:0"
            ),
        },
    };
    let listener = std::net::TcpListener::bind(parsed)
        .with_context(|| format!("cannot listen on {parsed} (--metrics)"))?;
    Ok(std::sync::Arc::new(listener))
}

/// Parses `HOST:PORT`, resolving a host name.
fn resolve(listen: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = listen.parse() {
        return Ok(addr);
    }
    match listen.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(addr)) => Ok(addr),
        _ => bail!(
            "invalid --listen address {listen:?}: expected HOST:PORT, such as \
             0.0.0.0:50051 or 127.0.0.1:0"
        ),
    }
}

/// A progress bar, hidden until [`show_progress`] draws it (after the
/// `listening on` line, which it must not interleave with on a terminal).
fn new_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}",
    )
    .expect("the template is valid");
    bar.set_style(style);
    bar.set_message("preparing jobs");
    bar
}

/// Draws progress snapshots until the run is complete or the channel closes.
async fn show_progress(bar: ProgressBar, mut rx: watch::Receiver<Progress>) {
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.enable_steady_tick(Duration::from_millis(200));
    while rx.changed().await.is_ok() {
        let p = rx.borrow_and_update().clone();
        bar.set_position((p.fraction() * 1000.0) as u64);
        let eta = p
            .eta()
            .map_or("?".to_owned(), |d| format!("{}s", d.as_secs()));
        bar.set_message(format!(
            "jobs {}/{} · {:.1} jobs/s · ETA {eta} · workers {}",
            p.counters.jobs_done,
            p.counters.jobs,
            p.jobs_per_second(),
            p.counters.workers
        ));
        if p.counters.complete {
            break;
        }
    }
    bar.finish_and_clear();
}

fn run_export(args: ExportArgs) -> anyhow::Result<()> {
    let format = args.format.parse()?;
    let options = ExportOptions {
        unique: args.unique,
        format,
    };
    let result = match &args.output {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            export(&args.data, &options, &mut std::io::BufWriter::new(file))
        }
        None => {
            let stdout = std::io::stdout();
            export(
                &args.data,
                &options,
                &mut std::io::BufWriter::new(stdout.lock()),
            )
        }
    };
    let summary = match result {
        // A closed pipe (`| head`) is a normal way for a listing to end.
        Err(nq_coord::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            return Ok(());
        }
        r => r?,
    };
    if !summary.complete {
        stderr_line(format_args!(
            "nq-coord: warning: the run in {} is not finished ({} of {} jobs done); \
             exported the solutions of finished jobs only",
            args.data.display(),
            summary.jobs_done,
            summary.jobs
        ));
    }
    Ok(())
}

/// A tracing writer that prints each event in one piece, suspending the
/// progress bar (if any) meanwhile.
#[derive(Clone)]
struct BarWriter(Option<ProgressBar>);

impl<'a> MakeWriter<'a> for BarWriter {
    type Writer = BarLine;

    fn make_writer(&'a self) -> BarLine {
        BarLine {
            bar: self.0.clone(),
            buf: Vec::new(),
        }
    }
}

/// One event's text, written out on drop.
struct BarLine {
    bar: Option<ProgressBar>,
    buf: Vec<u8>,
}

impl Write for BarLine {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for BarLine {
    fn drop(&mut self) {
        // Never fails, even when stderr is gone.
        let write = || nq_process::output::write_stderr(&self.buf);
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.suspend(write),
            _ => write(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every flag of the run and of each subcommand can be set from an `NQ_*`
    /// variable, and `--help` says which.
    #[test]
    fn every_flag_has_an_environment_variable() {
        let cmd = Args::command();
        let subcommands: Vec<_> = cmd.get_subcommands().cloned().collect();
        for command in std::iter::once(cmd).chain(subcommands) {
            if command.get_name() == "help" {
                continue;
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_else(|| {
                    panic!("{} --{id} has no env", command.get_name())
                });
                assert!(env.starts_with("NQ_"), "--{id}: {env}");
            }
        }
        // The run's flags are named after themselves: --n is NQ_N.
        for arg in Args::command().get_arguments() {
            let id = arg.get_id().as_str();
            if let Some(env) = arg.get_env() {
                assert_eq!(env.to_str(), Some(&*format!("NQ_{}", id.to_uppercase())));
            }
        }
    }

    #[test]
    fn local_thread_counts_are_capped_with_the_range_named() {
        let err = Args::try_parse_from(["c", "--n", "8", "--local-threads", "100000"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("0..=4096"), "{err}");
        let args =
            Args::try_parse_from(["c", "--n", "8", "--local-threads", "0"]).unwrap();
        assert_eq!(args.run.local_threads, Some(0));
    }

    #[test]
    fn status_connect_takes_the_workers_forms() {
        for (given, authority) in [
            ("coord", "coord:50051"),
            ("coord:7000", "coord:7000"),
            ("10.0.0.5", "10.0.0.5:50051"),
            ("::1", "[::1]:50051"),
            ("[::1]:7000", "[::1]:7000"),
        ] {
            assert_eq!(with_default_port(given, 50051), authority, "{given}");
        }
        let e = coordinator_endpoint("http://coord:7000/", Duration::from_secs(1), false)
            .unwrap();
        assert_eq!(e.uri().to_string(), "http://coord:7000/");
        assert!(coordinator_endpoint("bad host", Duration::from_secs(1), false).is_err());
        let e =
            coordinator_endpoint("https://coord", Duration::from_secs(1), true).unwrap();
        assert_eq!(e.uri().to_string(), "https://coord:50051/");
    }
}
