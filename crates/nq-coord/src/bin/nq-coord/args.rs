//! The command line of `nq-coord`: the clap structs of a run and of each
//! subcommand, and the conversion of a run's flags into the library's
//! [`Config`], which checks them ([`Config::validate`]).

use std::io::IsTerminal;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use nq_coord::Config;
use nq_coord::config::{parse_duration, parse_gpu_sample, parse_split, parse_verify};
use nq_core::pool::MAX_THREADS;
use nq_process::DialArgs;

/// Counts N-Queens solutions exactly: splits the board into jobs, runs them on
/// this machine's cores and on any `nq-worker` that connects, and keeps the
/// run in a data directory so that it survives restarts.
///
/// Prints `listening on ADDR` on stdout once bound, then one result line:
/// `n=N status=complete total=Q unique=U seconds=S jobs=J conflicts=C
/// audit=sha256:HEX published=match|MISMATCH|unknown` (or `status=unchecked
/// ... unchecked=K ...`, or `status=interrupted ...`). `audit` is the digest
/// that ends `nq-coord audit`'s output.
///
/// Every flag can also be set from the environment variable shown with it
/// (`NQ_N=12 NQ_DATA=/scratch/nq-12 nq-coord` runs like `nq-coord --n 12
/// --data /scratch/nq-12`), or in a TOML file given with --config, under
/// its long name (`n = 12`, `local-threads = 0`). A flag on the command
/// line wins over the environment, which wins over the file.
#[derive(Parser, Debug)]
#[command(name = "nq-coord", version, args_conflicts_with_subcommands = true)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    #[command(flatten)]
    pub(crate) log: nq_process::LogArgs,
}

/// Flags of a run.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Board size N, 1 to 32. Required for a new run; a run resumed from
    /// its --data directory reads it from there (a different --n is
    /// refused).
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
    pub(crate) listen: String,
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
    pub(crate) progress: ProgressMode,
    /// Interval between progress log lines.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        env = "NQ_PROGRESS_INTERVAL"
    )]
    progress_interval: String,
    /// Take a sealed backup of the run's store this often while it serves
    /// (a duration: 30m, 6h), into --backup-to. A restore loses at most the
    /// jobs finished since the last backup: they are computed again.
    #[arg(
        long,
        value_name = "DURATION",
        env = "NQ_BACKUP_EVERY",
        requires = "backup_to"
    )]
    backup_every: Option<String>,
    /// Directory of the periodic backups (created if missing; one per run):
    /// `backup-<unix ms>.nqbackup`, each written to a temporary file, synced
    /// and renamed; the newest two are kept. Put it on another disk than
    /// --data.
    #[arg(
        long,
        value_name = "DIR",
        env = "NQ_BACKUP_TO",
        requires = "backup_every"
    )]
    backup_to: Option<PathBuf>,
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
    /// Share of the jobs whose every copy ran on a GPU (`nq-worker --gpu`)
    /// that the trusted side (this machine's threads, or a --trust machine)
    /// computes again on a CPU kernel before they count, 0 to 1 (`0.005`,
    /// `0.5%`): two GPUs can agree on a GPU kernel's bug. The coordinator's
    /// cores do about 1/50 of a GPU's work, so the default, 0.5%, keeps them
    /// a quarter busy per GPU; with G GPUs use about 0.01/G, or add CPU
    /// machines under --trust. Without a trusted computation the sample is
    /// not taken. Stored with the run when it is created, like --verify: a
    /// resume without it uses the stored share.
    #[arg(
        long,
        value_name = "SHARE",
        env = "NQ_GPU_SAMPLE",
        default_value = "0.5%"
    )]
    gpu_sample: String,
    /// Serve an HTTP port at HOST:PORT with Prometheus metrics (`/metrics`),
    /// the run's status as JSON (`/status.json`) and a status page (`/`).
    /// Port 0 picks a free port; the address bound is printed as `metrics on
    /// ADDR` on stdout. Anyone who reaches it sees the workers' names and
    /// addresses: bind it to a private address.
    #[arg(long, value_name = "ADDR", env = "NQ_METRICS")]
    pub(crate) metrics: Option<String>,
    /// Without --token or TLS the coordinator serves workers on this machine
    /// only (protected mode) and refuses every other caller. This flag opens
    /// the port to ANYONE who can reach it: every such caller can register
    /// and report counts into the run. Prefer NQ_TOKEN on both sides.
    #[arg(long, env = "NQ_INSECURE_OPEN_PORT")]
    pub(crate) insecure_open_port: bool,
    /// Read the run's options from this TOML file: each under its long flag
    /// name, such as `n = 18`, `local-threads = 0`, `verify = 0.05`,
    /// `trust = ["token:lab"]`. A flag or NQ_* variable wins over the file.
    /// `--print-config` writes such a file.
    #[arg(long, value_name = "FILE", env = "NQ_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Print the effective options (flags, NQ_* variables, --config file
    /// and defaults) as a TOML file that --config takes, and exit. Secrets
    /// (--token, --store-key) are not printed.
    #[arg(long, env = "NQ_PRINT_CONFIG")]
    pub(crate) print_config: bool,
    /// Change the settings that decide what counts (--verify, --trust,
    /// --ban-after, --gpu-sample), stored with the run when it was created,
    /// to the values given now. Without it a resume that gives other values
    /// is refused. Each change is logged and listed in report.json.
    #[arg(long, env = "NQ_CHANGE_SETTINGS")]
    change_settings: bool,
    /// Which of --verify, --trust, --ban-after and --gpu-sample were given
    /// (set by `config_file::parse_from`, which knows where each value came
    /// from).
    #[arg(skip)]
    pub(crate) given: nq_coord::config::GivenSettings,
    #[command(flatten)]
    pub(crate) security: SecurityArgs,
    #[command(flatten)]
    pub(crate) store_key: StoreKeyArgs,
}

/// The store key: with one, every value in the data directory is sealed
/// with an HMAC-SHA256 tag, so that a value edited or moved by someone who
/// can write the directory but has not the key is refused (see
/// docs/trust.md, "A store key"). A store is made with a key or without
/// one, and is opened the same way ever after.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct StoreKeyArgs {
    /// Seal the data directory with the key in this file: 16 to 64 bytes
    /// written in hex or base64 (make one with `openssl rand -hex 32`). Keep
    /// it OUTSIDE the data directory, readable by the coordinator's user
    /// only. Every later run, resume, audit and export of the directory
    /// needs the same key.
    #[arg(
        long,
        value_name = "FILE",
        env = "NQ_STORE_KEY_FILE",
        conflicts_with = "store_key"
    )]
    pub(crate) store_key_file: Option<PathBuf>,
    /// The store key itself, in hex or base64 as in --store-key-file (text
    /// of hex digits only reads as hex). Set it in the environment, not on
    /// the command line, which every user of the machine can read.
    #[arg(long, value_name = "KEY", env = "NQ_STORE_KEY", hide_env_values = true)]
    pub(crate) store_key: Option<String>,
}

impl StoreKeyArgs {
    /// The key, read and checked, if one was given, for the data directory
    /// `data`. A key file inside `data` is refused: whoever can write the
    /// directory could read the key there.
    pub(crate) fn load(&self, data: &Path) -> anyhow::Result<Option<nq_store::StoreKey>> {
        use anyhow::Context;
        match (&self.store_key_file, &self.store_key) {
            (Some(path), _) => {
                // A directory or file that does not exist yet holds nothing.
                if let (Ok(file), Ok(dir)) = (path.canonicalize(), data.canonicalize())
                    && file.starts_with(&dir)
                {
                    anyhow::bail!(
                        "invalid --store-key-file {}: it is inside the data directory \
                         {}, where whoever can write the directory can read it; keep \
                         the key outside",
                        path.display(),
                        data.display()
                    );
                }
                nq_store::StoreKey::load(path).map(Some).with_context(|| {
                    format!("invalid --store-key-file {}", path.display())
                })
            }
            (None, Some(text)) => nq_store::StoreKey::parse(text)
                .map(Some)
                .context("invalid --store-key (or NQ_STORE_KEY)"),
            (None, None) => Ok(None),
        }
    }
}

impl RunArgs {
    /// Without `--n`, takes N from the run stored in `--data`, which is then
    /// resumed; with neither, or with a `--data` that holds no run, `--n`
    /// stays missing and the conversion into a [`Config`] refuses it. A
    /// `--n` that differs from the stored run's is refused when the run is
    /// opened, naming both.
    pub(crate) fn n_from_store(&mut self) -> anyhow::Result<()> {
        let (None, Some(data)) = (self.n, &self.data) else {
            return Ok(());
        };
        let key = self.store_key.load(data)?;
        self.n = nq_coord::stored_n(data, key.as_ref())?.map(u64::from);
        Ok(())
    }
}

/// Who may join the run. Without --token and TLS, workers on this machine
/// only (protected mode; see --insecure-open-port).
#[derive(clap::Args, Debug, Default)]
pub(crate) struct SecurityArgs {
    /// Shared secret that every worker must send (`authorization: Bearer
    /// TOKEN`); calls without it get UNAUTHENTICATED and are logged with the
    /// caller's address. The gRPC health and reflection services stay open
    /// (container probes, `grpcurl list`). Prefer the environment variable:
    /// a command line is visible to every user of the machine.
    #[arg(long, value_name = "TOKEN", env = "NQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Per-machine tokens: a file of `NAME TOKEN` lines, one per machine.
    /// A worker whose calls carry one of them (its own --token) is admitted
    /// and votes as NAME: one token is one voice in verification, however
    /// many processes or addresses use it. Recommended on any network you
    /// do not control; with mutual TLS the client certificate is the
    /// identity instead.
    #[arg(long, value_name = "FILE", env = "NQ_WORKER_TOKENS")]
    worker_tokens: Option<PathBuf>,
    /// Trust this identity (repeatable): a machine of your own, named by its
    /// credential, `token:NAME` or `cert:HEX` as logged at registration. Its
    /// copies settle disputes as the coordinator's own threads do, and
    /// nobody outvotes it.
    #[arg(long, value_name = "IDENTITY", env = "NQ_TRUST", value_delimiter = ',')]
    trust: Vec<String>,
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
    pub(crate) fn apply(&self, config: &mut Config) -> anyhow::Result<()> {
        use anyhow::Context;
        config.token = self
            .token
            .as_deref()
            .map(nq_proto::auth::Token::new)
            .transpose()
            .context("invalid --token (or NQ_TOKEN)")?;
        config.worker_tokens = self
            .worker_tokens
            .as_deref()
            .map(nq_coord::credentials::WorkerTokens::load)
            .transpose()
            .context("invalid --worker-tokens (or NQ_WORKER_TOKENS)")?
            .map(std::sync::Arc::new);
        config.trusted = self
            .trust
            .iter()
            .map(|t| nq_coord::credentials::trusted_identity(t))
            .collect::<Result<_, _>>()
            .context("invalid --trust (or NQ_TRUST)")?;
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

/// Where progress goes (`--progress`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProgressMode {
    // Plain comments: doc comments would add lines to `--help`.
    // A bar when stderr is a terminal, log lines otherwise.
    Auto,
    // Always the bar.
    Bar,
    // Always log lines.
    Log,
    // Neither.
    None,
}

/// The subcommands; without one, `nq-coord` runs.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// Copies are judged by the verify, trust, ban-after and gpu-sample
    /// stored with the run.
    Audit(AuditArgs),
    /// Asks a running coordinator where its run stands (the `Status` rpc):
    /// N, progress by estimated work, ETA, rates, the workers with their
    /// throughput and when each was last seen, conflicts, and the result
    /// once known. Text for people, or --json for scripts. When nothing
    /// answers and --data is given, a finished run is shown from its
    /// report.json.
    Status(StatusArgs),
    /// Writes a sealed backup of a run's store (SHA-256 over its content,
    /// with the run id, N, job count and time) to a file. A serving
    /// coordinator writes it itself, between two commits, when asked on
    /// DIR/backup.sock; a stopped run's directory is read directly. Prints
    /// `backup written: path=.. run=.. n=.. jobs=.. done=.. sha256=..`.
    Backup(BackupArgs),
    /// Rebuilds a data directory from a backup, after checking its seal (a
    /// truncated or altered file is refused, naming the problem). Then run
    /// `nq-coord --n N --data DIR` to resume: the jobs finished after the
    /// backup are computed again.
    Restore(RestoreArgs),
}

/// Flags of `nq-coord backup`.
#[derive(clap::Args, Debug)]
pub(crate) struct BackupArgs {
    /// The run's data directory (serving or stopped).
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    pub(crate) data: PathBuf,
    /// The backup file to write (replaced atomically if it exists).
    #[arg(long, value_name = "FILE", env = "NQ_BACKUP_FILE")]
    pub(crate) to: PathBuf,
    /// The run's store key, for a stopped run whose store is keyed (a
    /// serving run writes its backup itself, with its own key).
    #[command(flatten)]
    pub(crate) store_key: StoreKeyArgs,
}

/// Flags of `nq-coord restore`.
#[derive(clap::Args, Debug)]
pub(crate) struct RestoreArgs {
    /// The backup file.
    #[arg(long, value_name = "FILE", env = "NQ_RESTORE_FROM")]
    pub(crate) from: PathBuf,
    /// The data directory to rebuild: new or empty, unless --force.
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    pub(crate) data: PathBuf,
    /// Replace the data directory at --data (its run is lost; the backup is
    /// checked whole first). A directory that is not a data directory is
    /// never replaced.
    #[arg(long, env = "NQ_RESTORE_FORCE")]
    pub(crate) force: bool,
    /// The store key of the run backed up, for a keyed store: the restore
    /// reads the run back to check it against the backup's header.
    #[command(flatten)]
    pub(crate) store_key: StoreKeyArgs,
}

/// Flags of `nq-coord status`.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The coordinator: `host`, `host:port`, `http://host:port` or
    /// `https://host:port` (port 50051 when left out). Its HTTP port
    /// (--metrics) answers too, on a thread of its own: the quicker one
    /// while a thousand workers keep the coordinator busy.
    #[arg(
        long,
        value_name = "HOST[:PORT]",
        default_value = "127.0.0.1:50051",
        env = "NQ_CONNECT"
    )]
    pub(crate) connect: String,
    /// Print the status as one JSON document (counts as decimal strings).
    #[arg(long, env = "NQ_STATUS_JSON")]
    pub(crate) json: bool,
    /// The run's data directory: when no coordinator answers, a run that is
    /// over is shown from its DIR/report.json (the file itself with
    /// --json), and one that is not is named as such.
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    pub(crate) data: Option<PathBuf>,
    /// Give up after this long (connection and answer).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5s",
        env = "NQ_STATUS_TIMEOUT"
    )]
    pub(crate) timeout: String,
    /// TLS and token for the workers' port, where the Status rpc needs the
    /// token like any worker call (the HTTP port takes neither).
    #[command(flatten)]
    pub(crate) dial: DialArgs,
}

/// Flags of `nq-coord audit`.
#[derive(clap::Args, Debug)]
pub(crate) struct AuditArgs {
    /// The run's data directory (the coordinator must not be running on it).
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    pub(crate) data: PathBuf,
    /// Write the CSV to this file instead of stdout.
    #[arg(long, value_name = "FILE", env = "NQ_AUDIT_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// The verification share the run was judged with (`auto`, or 0 to 1,
    /// as `nq-coord --verify`), for a store that does not hold it: a run
    /// made with `--verify 0` (a load test) judged as `auto` reads as all
    /// unsettled, every job waiting for a check it never asked for. A store
    /// that holds its settings is judged by them whatever this says.
    #[arg(
        long,
        value_name = "SHARE",
        default_value = "auto",
        env = "NQ_AUDIT_VERIFY"
    )]
    pub(crate) verify: String,
    /// The key the run's store was made with, if any.
    #[command(flatten)]
    pub(crate) store_key: StoreKeyArgs,
}

/// Flags of `nq-coord health`.
#[derive(clap::Args, Debug)]
pub(crate) struct HealthArgs {
    /// The coordinator: `host`, `host:port`, `http://host:port` or
    /// `https://host:port` (port 50051 when left out); or its HTTP port
    /// (--metrics), which gives the same answer.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:50051",
        env = "NQ_CONNECT"
    )]
    pub(crate) connect: String,
    /// Give up after this long (connection and answer).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "2s",
        env = "NQ_HEALTH_TIMEOUT"
    )]
    pub(crate) timeout: String,
    /// TLS and token; the health service needs no token, but a proxy in
    /// front of the coordinator may.
    #[command(flatten)]
    pub(crate) dial: DialArgs,
}

/// Flags of `nq-coord export`.
#[derive(clap::Args, Debug)]
pub(crate) struct ExportArgs {
    /// The run's data directory.
    #[arg(long, value_name = "DIR", env = "NQ_DATA")]
    pub(crate) data: PathBuf,
    /// Only one solution per class of the 8 symmetries, in canonical form.
    #[arg(long, env = "NQ_EXPORT_UNIQUE")]
    pub(crate) unique: bool,
    /// Notation: vector ([1 3 0 2]), digits (2413, N ≤ 9), algebraic
    /// (a2 b4 c1 d3), json, string, board.
    #[arg(
        long,
        value_name = "F",
        default_value = "vector",
        env = "NQ_EXPORT_FORMAT"
    )]
    pub(crate) format: String,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE", env = "NQ_EXPORT_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// The key the run's store was made with, if any.
    #[command(flatten)]
    pub(crate) store_key: StoreKeyArgs,
}

/// A command line that the library refuses: `nq-coord` exits 2 for it, as
/// for the flags clap refuses.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct BadCommandLine(#[from] pub(crate) nq_coord::Error);

/// The flags as the library's [`Config`], checked by it; what it checks is
/// not checked here again. The security flags and the addresses to bind are
/// applied by the caller.
impl TryFrom<RunArgs> for Config {
    type Error = BadCommandLine;

    fn try_from(a: RunArgs) -> Result<Config, BadCommandLine> {
        let n = a.n.ok_or(nq_coord::Error::Option {
            option: "--n",
            value: "(missing)".into(),
            accepted: "given for a new run: the board size, 1 to 32 (a run \
                       resumed from its --data directory needs none)",
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
        config.target_jobs = a.jobs;
        config.max_job_size = a.job_size.unwrap_or(nq_coord::MAX_SUBS_PER_JOB);
        config.linger = match &a.linger {
            Some(linger) => parse_duration(linger)?,
            None => nq_coord::config::default_linger(config.lease_ttl),
        };
        config.cache_bytes = a.cache_mib.saturating_mul(1 << 20);
        config.verify = parse_verify(&a.verify)?;
        config.gpu_sample = parse_gpu_sample(&a.gpu_sample)?;
        config.insecure_open_port = a.insecure_open_port;
        config.given = a.given;
        config.change_settings = a.change_settings;
        if let (Some(every), Some(to)) = (&a.backup_every, a.backup_to) {
            config.backup = Some(nq_coord::config::PeriodicBackup {
                every: parse_duration(every)?,
                to,
            });
        }
        config.ban_after =
            NonZeroU32::new(a.ban_after).ok_or_else(|| nq_coord::Error::Option {
                option: "--ban-after",
                value: "0".into(),
                accepted: "at least 1",
            })?;
        config.progress_log = match a.progress {
            ProgressMode::Log => Some(parse_duration(&a.progress_interval)?),
            ProgressMode::Auto if !std::io::stderr().is_terminal() => {
                Some(parse_duration(&a.progress_interval)?)
            }
            _ => None,
        };
        config.validate()?;
        Ok(config)
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

    /// The flags the library checks are refused through it, with the flag
    /// and the accepted values named.
    #[test]
    fn out_of_range_flags_are_refused_by_the_library() {
        for (flag, value, accepted) in [
            ("--ban-after", "0", "at least 1"),
            ("--jobs", "0", "at least 1"),
            ("--job-size", "0", "1 to 4096"),
            ("--job-size", "4097", "1 to 4096"),
            ("--cache-mib", "0", "at least 1"),
            ("--verify", "2", "from 0 to 1"),
        ] {
            let args = Args::try_parse_from(["c", "--n", "8", flag, value]).unwrap();
            let err = Config::try_from(args.run).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("invalid {flag}: {value} (must be"))
                    && err.contains(accepted),
                "{flag} {value}: {err}"
            );
        }
        let args = Args::try_parse_from(["c"]).unwrap();
        let err = Config::try_from(args.run).unwrap_err().to_string();
        assert!(err.contains("--n"), "{err}");
        let args = Args::try_parse_from(["c", "--n", "8", "--ban-after", "1"]).unwrap();
        let config = Config::try_from(args.run).unwrap();
        assert_eq!(config.ban_after, NonZeroU32::MIN);
    }

    /// The store key comes from a file or from the flag (NQ_STORE_KEY), not
    /// both, for a run and for every subcommand that opens a data
    /// directory; a bad key is refused naming the flag and the accepted form.
    #[test]
    fn the_store_key_is_a_file_or_a_value_for_runs_audits_and_exports() {
        let both = ["--store-key-file", "k", "--store-key", "00"];
        let err =
            Args::try_parse_from([&["c", "--n", "8"][..], &both].concat()).unwrap_err();
        assert!(err.to_string().contains("cannot be used with"), "{err}");
        for sub in ["audit", "export"] {
            let args =
                Args::try_parse_from(["c", sub, "--data", "d", "--store-key", "zz"])
                    .unwrap();
            let key = match args.command {
                Some(Command::Audit(a)) => a.store_key,
                Some(Command::Export(e)) => e.store_key,
                other => panic!("{sub}: {other:?}"),
            };
            let err = format!("{:#}", key.load(Path::new("d")).unwrap_err());
            assert!(
                err.contains("invalid --store-key") && err.contains("hex"),
                "{sub}: {err}"
            );
        }
        let hex = "ab".repeat(32);
        let args = Args::try_parse_from(["c", "--n", "8", "--store-key", &hex]).unwrap();
        assert!(args.run.store_key.load(Path::new("d")).unwrap().is_some());
        let missing = StoreKeyArgs {
            store_key_file: Some("/nonexistent/nq.key".into()),
            store_key: None,
        };
        let err = format!("{:#}", missing.load(Path::new("d")).unwrap_err());
        assert!(err.contains("/nonexistent/nq.key"), "{err}");
        assert!(
            StoreKeyArgs::default()
                .load(Path::new("d"))
                .unwrap()
                .is_none()
        );
        // A key file inside the data directory is refused.
        let tmp = tempfile::tempdir().unwrap();
        let inside = tmp.path().join("store.key");
        std::fs::write(&inside, &hex).unwrap();
        let keyed = StoreKeyArgs {
            store_key_file: Some(inside),
            store_key: None,
        };
        let err = format!("{:#}", keyed.load(tmp.path()).unwrap_err());
        assert!(err.contains("inside the data directory"), "{err}");
        let elsewhere = tempfile::tempdir().unwrap();
        assert!(keyed.load(elsewhere.path()).unwrap().is_some());
    }

    /// Every subcommand that dials a coordinator takes the shared flags.
    #[test]
    fn client_subcommands_take_the_dial_flags() {
        for sub in ["status", "health"] {
            let args = Args::try_parse_from([
                "c",
                sub,
                "--token",
                "t",
                "--ca",
                "ca.pem",
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
            ])
            .unwrap_or_else(|e| panic!("{sub}: {e}"));
            let dial = match args.command {
                Some(Command::Status(s)) => s.dial,
                Some(Command::Health(h)) => h.dial,
                other => panic!("{sub}: {other:?}"),
            };
            assert_eq!(dial.token.as_deref(), Some("t"));
            assert_eq!(dial.ca, Some(PathBuf::from("ca.pem")));
        }
    }
}
