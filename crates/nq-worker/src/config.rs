//! The validated configuration of a worker, and the parsers that build it.
//!
//! The binary parses argv into its own `Args` and converts them into a
//! [`Config`] with `TryFrom`; this module supplies the checked pieces
//! ([`CoordinatorAddress`], from nq-proto, and [`parse_duration`]) so that every front end (CLI, tests,
//! embedders) gets the same validation and the same error messages.

use std::num::NonZeroUsize;
use std::time::Duration;

use nq_core::search::Kernel;
pub use nq_proto::address::{CoordinatorAddress, DEFAULT_PORT};

#[cfg(doc)]
use crate::Error;
use crate::Result;

/// Everything a worker needs to run. Build it with [`Config::new`] and adjust
/// the public fields; [`crate::run`] checks nothing further.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the coordinator listens.
    pub coordinator: CoordinatorAddress,
    /// CPU threads that run the search (at least 1).
    pub threads: NonZeroUsize,
    /// The count kernel: [`Kernel::Auto`] unless the run is meant as an
    /// independent recount of one made with the default kernel.
    pub kernel: Kernel,
    /// Name shown in the coordinator's logs and progress.
    pub name: String,
    /// How long a draining worker may keep computing its current jobs after
    /// the shutdown signal before it cancels them and hands them back.
    pub grace: Duration,
    /// Jobs kept outstanding at most: those being computed plus the prefetch
    /// queued behind them, so that threads never wait for the network. The
    /// prefetch is measured, on the CPU threads and on GPUs alike (see
    /// [`Prefetch`]), and this only limits it.
    pub max_jobs: usize,
    /// How deep the queue behind the running jobs is.
    pub prefetch: Prefetch,
    /// First delay before retrying a failed call; doubles on each further
    /// failure up to [`Config::backoff_max`], with random jitter.
    pub backoff_initial: Duration,
    /// Cap of the retry delay.
    pub backoff_max: Duration,
    /// Deadline of each unary call (Register, Lease, Release, count reports).
    pub rpc_timeout: Duration,
    /// How long the worker keeps trying without an answer from the
    /// coordinator (counted from its last answer, or from the start) before
    /// [`crate::run`] fails with [`Error::GaveUp`]; `None` waits forever.
    pub give_up: Option<Duration>,
    /// Sent on every call as `authorization: Bearer <token>`, for a
    /// coordinator started with a token.
    pub token: Option<nq_proto::auth::Token>,
    /// TLS towards the coordinator: the CA to trust and an optional client
    /// certificate. `None` with an `https://` coordinator trusts the system's
    /// CA certificates.
    pub tls: Option<nq_proto::tls::ClientTls>,
    /// The CUDA devices that count the jobs leaving the kernel to the worker
    /// (`--gpu`), or `None` for the CPU threads alone. Set it with
    /// [`Config::with_gpu`].
    pub gpu: Option<GpuDevices>,
}

impl Config {
    /// The defaults: every core, a 30 s grace, a measured prefetch of at most one job per
    /// thread, and retries from 100 ms up to 5 s.
    pub fn new(coordinator: CoordinatorAddress) -> Config {
        let threads = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
        Config {
            coordinator,
            threads,
            kernel: Kernel::Auto,
            name: "nq-worker".to_owned(),
            grace: Duration::from_secs(30),
            max_jobs: default_max_jobs(threads),
            prefetch: Prefetch::Measured,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            rpc_timeout: Duration::from_secs(10),
            give_up: Some(DEFAULT_GIVE_UP),
            token: None,
            tls: None,
            gpu: None,
        }
    }

    /// Counts on the CUDA `devices` too, leasing for them in proportion to
    /// their measured speed ([`Prefetch::Launches`]), up to [`GPU_MAX_JOBS`]
    /// per GPU (for [`GpuDevices::All`], per GPU found when the worker
    /// starts).
    pub fn with_gpu(mut self, devices: GpuDevices) -> Config {
        let known = match &devices {
            GpuDevices::All => 1,
            GpuDevices::List(list) => list.len(),
        };
        self.max_jobs = self.max_jobs.max(GPU_MAX_JOBS.saturating_mul(known));
        self.prefetch = Prefetch::Launches;
        self.gpu = Some(devices);
        self
    }

    /// Sets the thread count and the prefetch that goes with it.
    pub fn with_threads(mut self, threads: NonZeroUsize) -> Config {
        self.threads = threads;
        self.max_jobs = default_max_jobs(threads);
        self
    }
}

/// How many jobs a worker queues behind the ones it computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// The jobs its threads finish while a refill is on its way, measured
    /// (finishing rate times two lease round trips), none before the first
    /// measurement: short jobs never leave a thread waiting for the
    /// network, and a long job never waits behind another while a second
    /// machine runs dry (issue 26).
    Measured,
    /// For a `--gpu` worker: the jobs its GPUs finish while each of their
    /// streams counts one launch of about two seconds and one more is
    /// gathered, measured per launch, plus a refill (one job per stream
    /// before the first measurement). A GPU twice as fast holds twice as
    /// many; a run that lists solutions, or a worker whose GPUs all failed,
    /// is paced as [`Prefetch::Measured`] on the CPU threads.
    Launches,
    /// Always [`Config::max_jobs`]: for tests that need a full queue at once.
    Full,
}

/// The GPUs a worker counts on: `--gpu all` or `--gpu 0,2`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuDevices {
    /// Every CUDA device the driver reports when the worker starts.
    All,
    /// These devices, by index from 0: distinct, in the order given.
    List(Vec<usize>),
}

impl std::str::FromStr for GpuDevices {
    type Err = crate::Error;

    /// Parses `all`, or device indices separated by commas (`0`, `0,2`).
    ///
    /// ```
    /// use nq_worker::config::GpuDevices;
    /// assert_eq!("all".parse::<GpuDevices>().unwrap(), GpuDevices::All);
    /// assert_eq!("0,2".parse::<GpuDevices>().unwrap(), GpuDevices::List(vec![0, 2]));
    /// assert!("0,0".parse::<GpuDevices>().is_err());
    /// assert!("gpu1".parse::<GpuDevices>().is_err());
    /// ```
    fn from_str(input: &str) -> Result<GpuDevices> {
        let input = input.trim();
        if input.eq_ignore_ascii_case("all") {
            return Ok(GpuDevices::All);
        }
        let bad = || crate::Error::GpuDevices {
            input: input.to_owned(),
        };
        let mut list = vec![];
        for part in input.split(',') {
            let device: usize = part.trim().parse().map_err(|_| bad())?;
            if list.contains(&device) {
                return Err(bad());
            }
            list.push(device);
        }
        Ok(GpuDevices::List(list))
    }
}

/// Jobs a `--gpu` worker holds at most, per GPU; what it holds below that
/// follows the GPUs' measured speed ([`Prefetch::Launches`]). The GPU counts
/// every job queued while it was busy in one launch, so this also bounds how
/// much work one launch sees (with the coordinator's usual jobs, hundreds of
/// thousands of sub-problems, before the host expands them further into
/// tasks).
pub const GPU_MAX_JOBS: usize = 256;

/// The default of [`Config::give_up`]: ten minutes without an answer.
///
/// Long enough for a coordinator that is slow to come up (a batch job whose
/// nodes start together while the coordinator splits a large run, a pod
/// whose volume is re-attached after a restart), and short enough that a
/// worker that missed the end of a run (stopped while the coordinator
/// finished and left) gives back its Slurm allocation or pod within minutes
/// instead of holding it until it is killed.
pub const DEFAULT_GIVE_UP: Duration = Duration::from_secs(600);

/// Parses a `--give-up` value: a duration as [`parse_duration`] reads it, or
/// `never` (or a zero duration) to wait for a coordinator forever (`None`).
///
/// ```
/// use std::time::Duration;
/// use nq_worker::config::parse_give_up;
/// assert_eq!(parse_give_up("10m").unwrap(), Some(Duration::from_secs(600)));
/// assert_eq!(parse_give_up("never").unwrap(), None);
/// assert_eq!(parse_give_up("0").unwrap(), None);
/// assert!(parse_give_up("later").is_err());
/// ```
///
/// # Errors
///
/// [`Error::Duration`] naming the accepted forms.
pub fn parse_give_up(input: &str) -> Result<Option<Duration>> {
    if input.trim().eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    let limit = parse_duration(input)?;
    Ok((!limit.is_zero()).then_some(limit))
}

/// A duration the way a user writes it on the command line: `10m`, `2s`,
/// `1500ms`.
pub(crate) fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 {
        format!("{}ms", d.as_millis())
    } else if secs >= 3600 && secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// Two jobs per thread at most: one running, one queued behind it.
fn default_max_jobs(threads: NonZeroUsize) -> usize {
    threads.get().saturating_mul(2).max(2)
}

/// Parses a duration written as a number and a unit: `500ms`, `30s`, `1.5s`,
/// `2m`, `1h`; a bare number means seconds, and zero is allowed (`--grace 0s`
/// hands every job back at once). The syntax is the coordinator's too:
/// [`nq_proto::duration::parse_duration`].
///
/// ```
/// use std::time::Duration;
/// assert_eq!(nq_worker::parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
/// assert_eq!(nq_worker::parse_duration("250ms").unwrap(), Duration::from_millis(250));
/// assert!(nq_worker::parse_duration("soon").is_err());
/// ```
///
/// # Errors
///
/// [`Error::Duration`] naming the accepted forms.
pub fn parse_duration(input: &str) -> Result<Duration> {
    Ok(nq_proto::duration::parse_duration(input)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        for bad in ["", "s", "-1s", "1d", "1.2.3s", "ms"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn give_up_limits() {
        assert_eq!(parse_give_up("2s").unwrap(), Some(Duration::from_secs(2)));
        assert_eq!(parse_give_up(" Never ").unwrap(), None);
        assert_eq!(parse_give_up("0s").unwrap(), None);
        let err = parse_give_up("sometime").unwrap_err().to_string();
        assert!(err.contains("30s"), "{err}");
        assert_eq!(
            Config::new("h".parse().unwrap()).give_up,
            Some(DEFAULT_GIVE_UP)
        );
    }

    #[test]
    fn durations_are_written_as_users_write_them() {
        for (d, want) in [
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_millis(1500), "1500ms"),
        ] {
            assert_eq!(human(d), want);
        }
    }

    #[test]
    fn prefetch_follows_threads() {
        let c = Config::new("h".parse().unwrap()).with_threads(NonZeroUsize::MIN);
        assert_eq!(c.max_jobs, 2);
        let four = NonZeroUsize::new(4).unwrap();
        assert_eq!(c.with_threads(four).max_jobs, 8);
    }
}
