//! The validated configuration of a worker, and the parsers that build it.
//!
//! The binary parses argv into its own `Args` and converts them into a
//! [`Config`] with `TryFrom`; this module supplies the checked pieces
//! ([`Coordinator`], [`parse_duration`]) so that every front end (CLI, tests,
//! embedders) gets the same validation and the same error messages.

use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;
use std::time::Duration;

use nq_core::search::Kernel;

use crate::{Error, Result};

/// The coordinator's port when an address names none.
pub const DEFAULT_PORT: u16 = 50051;

/// Everything a worker needs to run. Build it with [`Config::new`] and adjust
/// the public fields; [`crate::run`] checks nothing further.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the coordinator listens.
    pub coordinator: Coordinator,
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
    /// worker asks for more as soon as fewer than `threads + 1` remain.
    pub max_jobs: usize,
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
    /// The CUDA device that counts the jobs leaving the kernel to the worker
    /// (`--gpu`), or `None` for the CPU threads alone. Set it with
    /// [`Config::with_gpu`].
    pub gpu: Option<usize>,
}

impl Config {
    /// The defaults: every core, a 30 s grace, a prefetch of one job per
    /// thread, and retries from 100 ms up to 5 s.
    pub fn new(coordinator: Coordinator) -> Config {
        let threads = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
        Config {
            coordinator,
            threads,
            kernel: Kernel::Auto,
            name: "nq-worker".to_owned(),
            grace: Duration::from_secs(30),
            max_jobs: default_max_jobs(threads),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            rpc_timeout: Duration::from_secs(10),
            give_up: Some(DEFAULT_GIVE_UP),
            token: None,
            tls: None,
            gpu: None,
        }
    }

    /// Counts on CUDA device `device` too, and keeps enough jobs in flight
    /// for it: [`GPU_MAX_JOBS`] at least.
    pub fn with_gpu(mut self, device: usize) -> Config {
        self.gpu = Some(device);
        self.max_jobs = self.max_jobs.max(GPU_MAX_JOBS);
        self
    }

    /// Sets the thread count and the prefetch that goes with it.
    pub fn with_threads(mut self, threads: NonZeroUsize) -> Config {
        self.threads = threads;
        self.max_jobs = default_max_jobs(threads);
        self
    }
}

/// Jobs a `--gpu` worker keeps in flight at least. The GPU counts every job
/// queued while it was busy in one launch, so this bounds how much work one
/// launch sees (with the coordinator's usual jobs, hundreds of thousands of
/// sub-problems, before the host expands them further into tasks).
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

/// Two jobs per thread: one running, one queued behind it.
fn default_max_jobs(threads: NonZeroUsize) -> usize {
    threads.get().saturating_mul(2).max(2)
}

/// A coordinator address: a host (name, IPv4, or bracketed IPv6), a port,
/// and whether to speak TLS.
///
/// Parses `host`, `host:port`, `http://host[:port]` and `https://host[:port]`;
/// the port defaults to [`DEFAULT_PORT`]. Displays as the URI the worker
/// dials.
///
/// ```
/// let c: nq_worker::Coordinator = "10.0.0.5".parse().unwrap();
/// assert_eq!(c.to_string(), "http://10.0.0.5:50051");
/// let c: nq_worker::Coordinator = "http://[::1]:7000".parse().unwrap();
/// assert_eq!(c.to_string(), "http://[::1]:7000");
/// let c: nq_worker::Coordinator = "https://coord:443".parse().unwrap();
/// assert!(c.tls());
/// assert!("grpc://coord:443".parse::<nq_worker::Coordinator>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coordinator {
    host: String,
    port: u16,
    tls: bool,
}

impl Coordinator {
    /// Whether the worker speaks TLS to it (`https://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The same address, spoken to over TLS.
    pub fn with_tls(self) -> Coordinator {
        Coordinator { tls: true, ..self }
    }

    /// The host part (IPv6 addresses keep their brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl From<std::net::SocketAddr> for Coordinator {
    fn from(addr: std::net::SocketAddr) -> Coordinator {
        let host = match addr.ip() {
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        };
        Coordinator {
            host,
            port: addr.port(),
            tls: false,
        }
    }
}

impl FromStr for Coordinator {
    type Err = Error;

    fn from_str(input: &str) -> Result<Coordinator> {
        let bad = |reason| Error::Address {
            input: input.to_owned(),
            reason,
        };
        let (rest, tls) = match input.split_once("://") {
            Some(("http", rest)) => (rest, false),
            Some(("https", rest)) => (rest, true),
            Some(_) => return Err(bad("the scheme must be http:// or https://")),
            None => (input, false),
        };
        // A trailing slash is harmless (`http://host:port/`); any other path is not.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Err(bad("the host is missing"));
        }
        if rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace) {
            return Err(bad("it must not contain a path, query, user or spaces"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (ip, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address needs its closing `]`"))?;
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad("the bracketed host is not an IPv6 address"));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected `:PORT` after the IPv6 address"))?,
                ),
            };
            (&rest[..ip.len() + 2], port)
        } else {
            match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is missing"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => {
                    return Err(bad("the port must be a number from 1 to 65535"));
                }
                Ok(p) => p,
            },
        };
        Ok(Coordinator {
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

impl fmt::Display for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
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
    fn addresses_in_every_accepted_form() {
        let cases = [
            ("coord", "http://coord:50051"),
            ("coord:7000", "http://coord:7000"),
            ("http://coord", "http://coord:50051"),
            ("http://127.0.0.1:7000/", "http://127.0.0.1:7000"),
            ("[::1]", "http://[::1]:50051"),
            ("http://[fe80::1]:9", "http://[fe80::1]:9"),
            ("https://coord", "https://coord:50051"),
            ("https://127.0.0.1:7000/", "https://127.0.0.1:7000"),
        ];
        for (input, want) in cases {
            let c: Coordinator = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(c.to_string(), want, "{input}");
        }
    }

    #[test]
    fn bad_addresses_name_the_accepted_forms() {
        for input in [
            "",
            "http://",
            ":50051",
            "coord:0",
            "coord:http",
            "coord:99999",
            "grpc://coord:1",
            "https://",
            "coord:1/path",
            "[::1",
            "[nope]:1",
            "a b",
        ] {
            let err = input.parse::<Coordinator>().unwrap_err().to_string();
            assert!(
                err.contains("HOST, HOST:PORT, http://HOST:PORT or https://HOST:PORT"),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn socket_addresses_convert() {
        let v6: std::net::SocketAddr = "[::1]:5".parse().unwrap();
        assert_eq!(Coordinator::from(v6).to_string(), "http://[::1]:5");
    }

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
