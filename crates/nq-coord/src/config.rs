//! The validated configuration of a coordinator run.
//!
//! The binary parses its command line into `Args` and converts it with
//! `TryFrom`; tests build a [`Config`] directly with [`Config::new`]. Nothing in
//! the library reads argv or the environment.
//!
//! Every check of a value lives here, in [`Config::validate`], which
//! [`crate::run`] calls before it touches the data directory: a caller that
//! sets a field out of range gets the error the command line would, never a
//! value quietly raised or cut to fit.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nq_core::Board;
use nq_core::pool::MAX_THREADS;
use nq_core::split::SplitSpec;
use tokio::sync::watch;

use crate::core::quorum::{DEFAULT_BAN_AFTER, DEFAULT_GPU_SAMPLE, Fraction};
use crate::core::status::Progress;
use crate::error::{Error, Result};

/// Default lease lifetime: long enough that a busy worker's heartbeat (every
/// TTL/3) never misses, short enough that a lost worker's jobs return soon.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// The default of [`Config::ban_after`]: [`DEFAULT_BAN_AFTER`] as the
/// non-zero count the field holds.
pub const DEFAULT_BAN_AFTER_NONZERO: NonZeroU32 = match NonZeroU32::new(DEFAULT_BAN_AFTER)
{
    Some(k) => k,
    None => panic!("DEFAULT_BAN_AFTER is at least 1"),
};

/// The default cap on the linger after completion (see [`Config::linger`])
/// for a lease lifetime of `lease_ttl`: a third of it plus one second.
///
/// A worker busy on a job (a repeat of one another worker finished) is heard
/// from only at its heartbeat, at least every TTL/3 by the protocol. A shorter
/// linger could end before it asks again; it would then find no coordinator
/// and retry forever, never told that the run is over. The linger ends as
/// soon as every recently seen worker was told, so the cap costs nothing when
/// none is busy.
pub fn default_linger(lease_ttl: Duration) -> Duration {
    lease_ttl / 3 + Duration::from_secs(1)
}

/// Everything [`crate::run`] needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The board.
    pub board: Board,
    /// The data directory (created if missing). It holds one run; see
    /// [`Config::default_data_dir`].
    pub data_dir: PathBuf,
    /// The split. `None` takes the stored run's split when resuming, and
    /// [`default_split`] for a new run.
    pub split: Option<SplitSpec>,
    /// Store every solution (workers stream them) so that `export` can list
    /// them.
    pub solutions: bool,
    /// Threads of the coordinator's own embedded worker, 0 to
    /// [`MAX_THREADS`]; 0 only serves.
    pub local_threads: usize,
    /// Lease lifetime, more than zero.
    pub lease_ttl: Duration,
    /// Target number of jobs for a new run, at least 1 (ignored when
    /// resuming). `None` means [`default_target_jobs`].
    pub target_jobs: Option<u64>,
    /// At most this many sub-problems per job, 1 to
    /// [`crate::MAX_SUBS_PER_JOB`] (the default). 1 makes one job per
    /// sub-problem, e.g. for load tests. Ignored when resuming.
    pub max_job_size: usize,
    /// After the last job, keep answering `Lease` with `run_complete = true`
    /// until every worker heard from within one TTL was told, but no longer
    /// than this. Keep it above a third of `lease_ttl` ([`default_linger`]).
    pub linger: Duration,
    /// sled page cache in bytes, more than zero.
    pub cache_bytes: u64,
    /// The key that seals every stored value (see [`nq_store::seal`]); a
    /// store created with one must be opened with it. Keep it OUTSIDE the
    /// data directory.
    pub store_key: Option<nq_store::StoreKey>,
    /// Receives progress snapshots (a few per second) when set.
    pub progress: Option<watch::Sender<Progress>>,
    /// Log an `info!` progress line this often (more than zero) when set.
    pub progress_log: Option<Duration>,
    /// How many jobs are computed twice by different workers (see
    /// [`crate::quorum`]); a fixed share is 0 to 1.
    pub verify: Fraction,
    /// Lost verification conflicts after which a worker is refused (never
    /// zero: the first lost conflict would then ban before it is counted).
    pub ban_after: NonZeroU32,
    /// The share of the jobs, 0 to 1, that the trusted side (the local
    /// threads, `--trust` machines) recomputes on a CPU kernel when every
    /// copy ran on a GPU (`--gpu-sample`, the CPU sample of
    /// [`crate::quorum`]; [`DEFAULT_GPU_SAMPLE`]). It decides what counts,
    /// so it travels with the run as [`Config::verify`] does (see
    /// [`Config::given`]): a resume without it takes the stored share.
    pub gpu_sample: f64,
    /// When set, every call of the `nqueens.v1.Coordinator` service must
    /// carry `authorization: Bearer <token>`; others get UNAUTHENTICATED. The
    /// health and reflection services stay open.
    pub token: Option<nq_proto::auth::Token>,
    /// Per-machine tokens (`--worker-tokens`): a call carrying one of them
    /// is admitted, and its worker votes as the token's name (see
    /// [`crate::credentials`]). With them, a call needs one of these or
    /// [`Config::token`].
    pub worker_tokens: Option<std::sync::Arc<crate::credentials::WorkerTokens>>,
    /// Identities the operator trusts (`--trust`, checked by
    /// [`crate::credentials::trusted_identity`]): like the coordinator's own
    /// threads, their copies decide disputes.
    pub trusted: Vec<String>,
    /// Serve TLS (and require client certificates with a client CA) when set.
    pub tls: Option<nq_proto::tls::ServerTls>,
    /// With neither [`Config::token`] nor [`Config::tls`], the coordinator
    /// serves callers on its own machine only (protected mode) unless this is
    /// set: then ANYONE who reaches the port can register and report counts.
    pub insecure_open_port: bool,
    /// A bound listener on which to serve the HTTP port (`--metrics`):
    /// `/metrics`, `/status.json` and the status page (see `crate::adapters::http`).
    /// Bound by the caller, so that it knows the address before the run
    /// starts. `None` serves no HTTP.
    pub http_listener: Option<Arc<std::net::TcpListener>>,
    /// Periodic backups of the store while the run serves
    /// (`--backup-every`, `--backup-to`). `None` takes none; `nq-coord
    /// backup` takes one on request either way.
    pub backup: Option<PeriodicBackup>,
    /// Which of the settings that decide what counts ([`Config::verify`],
    /// [`Config::trusted`], [`Config::ban_after`], [`Config::gpu_sample`])
    /// the caller gave. They are stored with the run when it is created; a
    /// resume takes the stored value of each setting not given, and refuses
    /// a given one that differs unless [`Config::change_settings`] is set.
    /// A run whose stored settings predate `--gpu-sample` takes this
    /// session's share (given or default) and stores it.
    /// [`Config::new`] gives none.
    pub given: GivenSettings,
    /// `--change-settings`: a resume may change the stored settings that
    /// decide what counts to the given ones. Each change is logged as a
    /// warning, stored with the run and listed in `report.json`.
    pub change_settings: bool,
}

/// Which of the settings that decide what counts a session gives (see
/// [`Config::given`]): on a flag, in the environment or in a config file,
/// as opposed to left at their defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GivenSettings {
    /// `--verify` ([`Config::verify`]).
    pub verify: bool,
    /// `--trust` ([`Config::trusted`]).
    pub trust: bool,
    /// `--ban-after` ([`Config::ban_after`]).
    pub ban_after: bool,
    /// `--gpu-sample` ([`Config::gpu_sample`]).
    pub gpu_sample: bool,
}

/// Periodic backups (see [`Config::backup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeriodicBackup {
    /// Time between two backups, from the start of the session.
    pub every: Duration,
    /// The directory that holds them (created if missing), named
    /// `backup-<unix ms>.nqbackup`; the newest two are kept. One directory
    /// per run: older backups of another run there would be deleted.
    pub to: PathBuf,
}

impl Config {
    /// A configuration with defaults: the given board and directory, default
    /// split, no solutions, NO local threads (the library default only serves;
    /// the `nq-coord` binary defaults to all cores), 30 s leases, default job
    /// count, an 11 s linger cap, 16 MiB cache, no progress output, no token and
    /// no TLS (so protected mode: loopback callers only).
    ///
    /// # Errors
    ///
    /// [`Error::Board`] when `n` is not 1 to 32.
    pub fn new(n: u64, data_dir: impl Into<PathBuf>) -> Result<Config> {
        Ok(Config {
            board: Board::new(n).map_err(Error::Board)?,
            data_dir: data_dir.into(),
            split: None,
            solutions: false,
            local_threads: 0,
            lease_ttl: DEFAULT_LEASE_TTL,
            target_jobs: None,
            max_job_size: crate::MAX_SUBS_PER_JOB,
            linger: default_linger(DEFAULT_LEASE_TTL),
            cache_bytes: nq_store::DEFAULT_CACHE_BYTES,
            store_key: None,
            progress: None,
            progress_log: None,
            verify: Fraction::Auto,
            ban_after: DEFAULT_BAN_AFTER_NONZERO,
            gpu_sample: DEFAULT_GPU_SAMPLE,
            token: None,
            worker_tokens: None,
            trusted: Vec::new(),
            tls: None,
            insecure_open_port: false,
            http_listener: None,
            backup: None,
            given: GivenSettings::default(),
            change_settings: false,
        })
    }

    /// Checks every field against the range its doc states, naming the
    /// flag that sets it and the accepted values. [`crate::run`] calls it
    /// first; the binary calls it too, so that a bad flag fails before a
    /// port is bound.
    ///
    /// # Errors
    ///
    /// [`Error::Option`] for the first field out of range.
    pub fn validate(&self) -> Result<()> {
        let refuse = |option, value: String, accepted| {
            Err(Error::Option {
                option,
                value,
                accepted,
            })
        };
        if self.local_threads > MAX_THREADS {
            return refuse(
                "--local-threads",
                self.local_threads.to_string(),
                "0 to 4096 (0 only serves remote workers)",
            );
        }
        if self.lease_ttl.is_zero() {
            return refuse("--lease-ttl", "0s".into(), "more than zero, such as 30s");
        }
        if self.target_jobs == Some(0) {
            return refuse("--jobs", "0".into(), "at least 1");
        }
        if !(1..=crate::MAX_SUBS_PER_JOB).contains(&self.max_job_size) {
            return refuse("--job-size", self.max_job_size.to_string(), "1 to 4096");
        }
        if self.cache_bytes == 0 {
            return refuse("--cache-mib", "0".into(), "at least 1");
        }
        if self.progress_log.is_some_and(|every| every.is_zero()) {
            return refuse(
                "--progress-interval",
                "0s".into(),
                "more than zero, such as 10s",
            );
        }
        if let Fraction::Fixed(share) = self.verify
            && !(0.0..=1.0).contains(&share)
        {
            return refuse("--verify", share.to_string(), VERIFY_FORMS);
        }
        if !(0.0..=1.0).contains(&self.gpu_sample) {
            return refuse("--gpu-sample", self.gpu_sample.to_string(), SHARE_FORMS);
        }
        if self.backup.as_ref().is_some_and(|b| b.every.is_zero()) {
            return refuse("--backup-every", "0s".into(), "more than zero, such as 1h");
        }
        Ok(())
    }

    /// The default data directory: `nq-<N>.sled` in the working directory, or
    /// `nq-<N>-solutions.sled` for a solutions run (so that the two kinds of
    /// run never refuse each other's directory).
    pub fn default_data_dir(n: u64, solutions: bool) -> PathBuf {
        if solutions {
            PathBuf::from(format!("nq-{n}-solutions.sled"))
        } else {
            PathBuf::from(format!("nq-{n}.sled"))
        }
    }
}

/// The default split of a new run: nq-core's border split (ring 0), with
/// extra pre-placed columns until there is at least one sub-problem per four
/// target jobs ([`default_target_jobs`]). Depends on N only: split 0:0 up to
/// N = 18 (224 sub-problems at N = 17, the split `nq count` uses, and the
/// fastest there: each extra column repeats more of the top of the search
/// tree, about 10 % at N = 17), 0:1 from N = 19 (8899 at N = 22), 0:2 from
/// N = 24. Finer splits balance more workers; `--split` overrides.
pub fn default_split(board: Board) -> SplitSpec {
    SplitSpec::for_count(board, default_target_jobs(board) / 4)
}

/// The default target job count: 256 up to N = 16, doubling with each larger
/// N (1024 at N = 18, 16384 at N = 22, capped at 2²⁰), since the work grows
/// about 7-fold per N. Jobs then take about a millisecond at N = 16 and tens
/// of seconds at N = 24 on one core with the AVX-512 kernel (about five times
/// longer on the scalar one): enough jobs to balance many workers, few enough
/// that RPC overhead stays negligible.
pub fn default_target_jobs(board: Board) -> u64 {
    let extra = u32::from(board.n().saturating_sub(16)).min(12);
    256 << extra
}

/// The values `--verify` accepts, for error messages.
const VERIFY_FORMS: &str =
    "`auto`, or a share of the jobs from 0 to 1 such as 0.05 or 5%";

/// The values `--gpu-sample` accepts, for error messages.
const SHARE_FORMS: &str = "a share of the jobs from 0 to 1 such as 0.005 or 0.5%";

/// Parses `--verify`: `auto`, or a share of the jobs from 0 to 1 (`0.05`, or
/// a percentage such as `5%`).
///
/// # Errors
///
/// [`Error::Option`] naming the accepted forms.
pub fn parse_verify(input: &str) -> Result<Fraction> {
    if input.trim().eq_ignore_ascii_case("auto") {
        return Ok(Fraction::Auto);
    }
    parse_share("--verify", input, VERIFY_FORMS).map(Fraction::Fixed)
}

/// Parses `--gpu-sample`: a share of the jobs from 0 to 1 (`0.005`, or a
/// percentage such as `0.5%`).
///
/// # Errors
///
/// [`Error::Option`] naming the accepted forms.
pub fn parse_gpu_sample(input: &str) -> Result<f64> {
    parse_share("--gpu-sample", input, SHARE_FORMS)
}

/// A share from 0 to 1, as a number or a percentage, for `option`.
fn parse_share(option: &'static str, input: &str, accepted: &'static str) -> Result<f64> {
    let bad = || Error::Option {
        option,
        value: input.to_owned(),
        accepted,
    };
    let s = input.trim();
    let share = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => s.parse::<f64>().map_err(|_| bad())?,
    };
    if !(0.0..=1.0).contains(&share) {
        return Err(bad());
    }
    Ok(share)
}

/// Parses a split specification `RING:EXTRA`, e.g. `1:0`.
///
/// # Errors
///
/// [`Error::SplitSyntax`] when it is not two integers separated by `:`;
/// [`Error::Split`] when they are out of range.
pub fn parse_split(input: &str) -> Result<SplitSpec> {
    let syntax = || Error::SplitSyntax {
        input: input.to_owned(),
    };
    let (ring, extra) = input.trim().split_once(':').ok_or_else(syntax)?;
    let ring: u8 = ring.trim().parse().map_err(|_| syntax())?;
    let extra: u8 = extra.trim().parse().map_err(|_| syntax())?;
    SplitSpec::new(ring, extra).map_err(|source| Error::Split {
        input: input.to_owned(),
        source,
    })
}

/// Parses a positive duration in the syntax both command lines share
/// ([`nq_proto::duration::parse_duration`]): `500ms`, `30s`, `1.5m`, or a
/// bare number of seconds.
///
/// # Errors
///
/// [`Error::Duration`] for anything else, zero included: no option of the
/// coordinator means anything with a zero duration.
pub fn parse_duration(input: &str) -> Result<Duration> {
    match nq_proto::duration::parse_duration(input) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(Error::Duration {
            input: input.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_parse_and_name_the_accepted_form() {
        assert_eq!(parse_split("1:2").unwrap(), SplitSpec::new(1, 2).unwrap());
        for bad in ["", "1", "1:", "a:1", "1:2:3", "-1:0"] {
            let msg = parse_split(bad).unwrap_err().to_string();
            assert!(msg.contains("RING:EXTRA"), "{bad:?}: {msg}");
        }
        let msg = parse_split("4:0").unwrap_err().chain();
        assert!(msg.contains("4:0") && msg.contains("ring"), "{msg}");
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "0s", "abc", "10 parsecs", "-3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_linger_outlasts_a_busy_workers_heartbeat() {
        // Workers beat at least every TTL/3 (the protocol), nq-worker every TTL/4.
        for secs in [1, 2, 30, 300] {
            let ttl = Duration::from_secs(secs);
            assert!(default_linger(ttl) > ttl / 3, "ttl {ttl:?}");
        }
        assert_eq!(Config::new(8, "d").unwrap().linger, Duration::from_secs(11));
    }

    #[test]
    fn the_defaults_are_valid() {
        let config = Config::new(8, "d").unwrap();
        config.validate().unwrap();
        assert_eq!(config.ban_after.get(), DEFAULT_BAN_AFTER);
    }

    /// A value out of range is refused with the flag and the accepted form
    /// named, never raised or cut to fit.
    #[test]
    fn out_of_range_fields_are_refused_by_name() {
        type Spoil = fn(&mut Config);
        let cases: [(&str, Spoil); 8] = [
            ("--local-threads", |c| c.local_threads = MAX_THREADS + 1),
            ("--lease-ttl", |c| c.lease_ttl = Duration::ZERO),
            ("--jobs", |c| c.target_jobs = Some(0)),
            ("--job-size", |c| c.max_job_size = 0),
            ("--job-size", |c| {
                c.max_job_size = crate::MAX_SUBS_PER_JOB + 1
            }),
            ("--cache-mib", |c| c.cache_bytes = 0),
            ("--progress-interval", |c| {
                c.progress_log = Some(Duration::ZERO)
            }),
            ("--verify", |c| c.verify = Fraction::Fixed(1.5)),
        ];
        for (option, spoil) in cases {
            let mut config = Config::new(8, "d").unwrap();
            spoil(&mut config);
            let msg = config.validate().unwrap_err().to_string();
            assert!(msg.starts_with(&format!("invalid {option}: ")), "{msg}");
            assert!(msg.contains("must be"), "{msg}");
        }
        let mut nan = Config::new(8, "d").unwrap();
        nan.verify = Fraction::Fixed(f64::NAN);
        assert!(nan.validate().is_err());
        // The edges are accepted.
        let mut edges = Config::new(8, "d").unwrap();
        edges.local_threads = MAX_THREADS;
        edges.max_job_size = 1;
        edges.target_jobs = Some(1);
        edges.verify = Fraction::Fixed(1.0);
        edges.validate().unwrap();
    }

    #[test]
    fn defaults_grow_with_n() {
        let b = |n| Board::new(n).unwrap();
        assert_eq!(default_split(b(16)), SplitSpec::BORDER);
        assert_eq!(default_split(b(17)), SplitSpec::BORDER);
        assert_eq!(default_split(b(22)), SplitSpec::border(1).unwrap());
        assert!(default_split(b(8)).is_border());
        assert_eq!(default_target_jobs(b(8)), 256);
        assert_eq!(default_target_jobs(b(16)), 256);
        assert_eq!(default_target_jobs(b(18)), 1024);
        assert_eq!(default_target_jobs(b(32)), 1 << 20);
        assert!(Config::new(0, "x").is_err());
        assert_eq!(
            Config::default_data_dir(16, false),
            PathBuf::from("nq-16.sled")
        );
    }
}
