//! The worker's side of the gRPC protocol: typed calls, the sorting of
//! failures, the retry backoff, the task that reports one job, and the
//! batcher that sends the count-only results of many jobs in one call.
//!
//! Failures sort five ways ([`Failure`]): network trouble and overload are
//! retried with backoff; an unknown worker id means the coordinator restarted
//! and the worker must register again; PERMISSION_DENIED refuses a report (or,
//! on Lease and Register, the worker itself); UNAUTHENTICATED (a refused
//! token, or a coordinator in protected mode refusing another machine), a
//! failed TLS handshake and a TLS port reached in plain text are
//! configuration errors that stop the worker; anything else
//! is fatal for the call. This follows ballista's split of task failures into
//! retryable and not.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use nq_core::pool::JobOutcome;
use nq_proto::auth::Bearer;
use nq_proto::pb::coordinator_client::CoordinatorClient;
use nq_proto::pb::report_ack::Outcome;
use nq_proto::pb::{self, report_chunk::Body};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::Stream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::{debug, info, warn};

use crate::Error;
use crate::config::Config;
use crate::pool::{Attempt, Produced};

mod batch;
pub(crate) use batch::{Batcher, Sent};

/// The coordinator's job id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct JobId(pub(crate) u64);

/// The id of one lease of a job; a job leased twice has two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct LeaseId(pub(crate) u64);

/// The id the coordinator gave this worker at registration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct WorkerId(pub(crate) String);

/// How to react to a failed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The coordinator is unreachable, restarting or overloaded: retry the
    /// same call after a backoff.
    Retry,
    /// The coordinator does not know this worker id (it restarted): register
    /// again, then retry.
    Register,
    /// PERMISSION_DENIED. On a report: the coordinator refuses that report
    /// (its lease is not valid for it); drop it and go on. On Lease or
    /// Register: this worker is refused work (e.g. after lost verification
    /// conflicts); stop with the coordinator's message.
    Denied,
    /// UNAUTHENTICATED: the coordinator refused the token. The worker stops.
    Token,
    /// The TLS handshake failed (a certificate refused or unverifiable): a
    /// configuration error that retrying cannot fix. The worker stops.
    Tls(String),
    /// Retrying cannot help.
    Fatal,
}

impl Failure {
    /// Sorts a status from Register, Lease, Report or Release.
    pub(crate) fn of(status: &Status) -> Failure {
        match status.code() {
            Code::FailedPrecondition => Failure::Register,
            Code::PermissionDenied => Failure::Denied,
            Code::Unauthenticated => Failure::Token,
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::OutOfRange
            | Code::Unimplemented => Failure::Fatal,
            // Unavailable and DeadlineExceeded are the network; Unknown and
            // Cancelled are what a connection cut mid-call looks like; Internal,
            // Aborted and ResourceExhausted are the coordinator's store or load,
            // which a restart or a pause fixes. A connection that failed in its
            // TLS handshake looks the same until the rustls error behind it is
            // found.
            _ => match std::error::Error::source(status)
                .and_then(nq_proto::tls::tls_failure)
            {
                Some(reason) => Failure::Tls(reason),
                None => Failure::Retry,
            },
        }
    }
}

/// Repeats the TLS handshake with the coordinator outside tonic and reads the
/// server's verdict, to tell a refused certificate from a coordinator that is
/// down or busy. Returns what rustls says when the handshake was refused.
///
/// Needed because with TLS 1.3 the server checks the client's certificate
/// after the client has finished its handshake: tonic then reports only "a
/// closed connection", which looks like a coordinator restarting, and the
/// worker would retry a certificate the coordinator never accepts. Only with
/// a CA file (`ClientTls::rustls_config`); costs one connection and at most
/// a second or two per call.
pub(crate) async fn diagnose_tls(config: &Config) -> Option<String> {
    use tokio::io::AsyncReadExt;
    const PATIENCE: Duration = Duration::from_secs(1);

    let rustls = config.tls.as_ref()?.rustls_config()?;
    let host = config.coordinator.host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name =
        tokio_rustls::rustls::pki_types::ServerName::try_from(bare.to_owned()).ok()?;
    let tcp = tokio::time::timeout(
        PATIENCE,
        tokio::net::TcpStream::connect((bare, config.coordinator.port())),
    )
    .await
    .ok()?
    .ok()?;
    let connector = tokio_rustls::TlsConnector::from(rustls);
    let mut stream =
        match tokio::time::timeout(PATIENCE, connector.connect(name, tcp)).await {
            Err(_) => return None,
            Ok(Err(e)) => return nq_proto::tls::tls_failure(&e),
            Ok(Ok(stream)) => stream,
        };
    // An accepted client hears nothing until it speaks (or the server's HTTP/2
    // settings); a refused one gets the alert.
    let mut byte = [0u8; 1];
    match tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await {
        Ok(Err(e)) => nq_proto::tls::tls_failure(&e),
        _ => None,
    }
}

/// True when the coordinator's port answers the HTTP/2 client preface with
/// a TLS record (an alert, or a handshake): it speaks TLS, and a plain-text
/// worker can never get through. Costs one connection and at most a second
/// or two; false when the port cannot be reached or answers anything else.
///
/// A TLS server reads the preface as a malformed ClientHello and answers
/// with a TLS alert record, `15 03 0x`. An HTTP/2 server answers with its
/// SETTINGS frame, whose 24-bit length starts with a zero byte: no frame may
/// exceed 16 KiB before the settings allow it, so it never starts `15`.
pub(crate) async fn speaks_tls(coordinator: &crate::CoordinatorAddress) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PATIENCE: Duration = Duration::from_secs(1);
    /// What every HTTP/2 client sends first (RFC 9113, section 3.4), then an
    /// empty SETTINGS frame.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

    let host = coordinator.host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect((bare, coordinator.port())).await?;
        tcp.write_all(PREFACE).await?;
        let mut head = [0u8; 3];
        tcp.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(PATIENCE, probe).await {
        Ok(Ok(head)) => is_tls_record(head),
        _ => false,
    }
}

/// True when `head` starts a TLS record: content type alert (21) or
/// handshake (22), then protocol version 3.x.
fn is_tls_record(head: [u8; 3]) -> bool {
    matches!(head, [0x15 | 0x16, 0x03, 0x00..=0x04])
}

/// Why a call found no coordinator, for a person: the operating system's
/// words when the connection failed (`connection refused`, a name that does
/// not resolve, a timeout), else the status message.
pub(crate) fn unreachable_reason(status: &Status) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> =
        std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                std::io::ErrorKind::TimedOut => "the connection timed out".to_owned(),
                _ => io.to_string(),
            };
        }
        cause = e.source();
    }
    match status.message() {
        "" => format!("{:?}", status.code()),
        message => message.to_owned(),
    }
}

/// True when the call failed because nothing listens at the address: the
/// connection was refused.
fn refused(status: &Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> =
        std::error::Error::source(status);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// How often a worker that keeps failing to reach its coordinator says it
/// is still trying.
const REMIND_EVERY: Duration = Duration::from_secs(60);

/// What the worker tells its user while no coordinator answers: one clear
/// warning when the silence starts (what failed, what to check, how long it
/// waits), a reminder every [`REMIND_EVERY`] with the time left, and a line
/// when the coordinator answers again. Each failed call, every few seconds,
/// is logged by its caller at `debug` only.
///
/// Shared ([`SharedOutage`]) by the lease loop and the report tasks: the
/// first call to find the coordinator gone, often a report (the heartbeat
/// comes only every quarter lease), opens the silence, and only once.
#[derive(Debug)]
pub(crate) struct Outage {
    coordinator: crate::CoordinatorAddress,
    /// `Config::give_up`.
    give_up: Option<Duration>,
    /// When the coordinator last answered (or when the worker started): the
    /// `--give-up` clock, kept by the lease loop, which gives up.
    last_answer: tokio::time::Instant,
    /// Whether a coordinator ever answered: then it went away, rather than
    /// never came.
    answered: bool,
    /// When the first failed call of the current silence failed.
    since: Option<tokio::time::Instant>,
    /// When the user was last told about it.
    told: tokio::time::Instant,
}

/// The [`Outage`] of one worker, for its lease loop and report tasks.
pub(crate) type SharedOutage = Arc<std::sync::Mutex<Outage>>;

/// The outage, locked. Its methods only log and set fields, so a panic
/// elsewhere while it was held leaves it usable.
pub(crate) fn lock(outage: &SharedOutage) -> std::sync::MutexGuard<'_, Outage> {
    outage
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Outage {
    pub(crate) fn new(config: &Config) -> Outage {
        let now = tokio::time::Instant::now();
        Outage {
            coordinator: config.coordinator.clone(),
            give_up: config.give_up,
            last_answer: now,
            answered: false,
            since: None,
            told: now,
        }
    }

    /// A call failed without reaching a coordinator, and will be retried.
    pub(crate) fn failed(&mut self, status: &Status) {
        let now = tokio::time::Instant::now();
        let Some(since) = self.since else {
            self.since = Some(now);
            self.told = now;
            warn!("{}", self.first_words(status, now));
            return;
        };
        if now.duration_since(self.told) >= REMIND_EVERY {
            self.told = now;
            let waited = short(now.duration_since(since));
            let reason = unreachable_reason(status);
            match self.left(now) {
                Some(left) => info!(
                    coordinator = %self.coordinator,
                    "still no answer from the coordinator after {waited} ({reason}); giving \
                     up in {} (--give-up)",
                    short(left)
                ),
                None => info!(
                    coordinator = %self.coordinator,
                    "still no answer from the coordinator after {waited} ({reason}); waiting \
                     with no time limit (--give-up never)"
                ),
            }
        }
    }

    /// The coordinator answered: the `--give-up` clock starts again, and a
    /// silence that was announced ends, saying so.
    pub(crate) fn answered(&mut self) {
        let now = tokio::time::Instant::now();
        self.last_answer = now;
        self.answered = true;
        if let Some(since) = self.since.take() {
            info!(
                coordinator = %self.coordinator,
                "the coordinator answers again after {}",
                short(now.duration_since(since))
            );
        }
    }

    /// The time left before the worker gives up; `None` when it never does.
    fn left(&self, now: tokio::time::Instant) -> Option<Duration> {
        self.give_up
            .map(|limit| (self.last_answer + limit).saturating_duration_since(now))
    }

    /// The warning that opens a silence.
    fn first_words(&self, status: &Status, now: tokio::time::Instant) -> String {
        let address = &self.coordinator;
        let reason = unreachable_reason(status);
        let wait = match (self.give_up, self.left(now)) {
            (Some(limit), Some(left)) if self.answered => format!(
                "for up to {} more (--give-up {}), then the worker stops",
                short(left),
                crate::config::human(limit)
            ),
            (Some(limit), _) => format!(
                "retrying for up to {} (--give-up), then the worker stops",
                crate::config::human(limit)
            ),
            _ if self.answered => "with no time limit (--give-up never)".to_owned(),
            _ => "retrying with no time limit (--give-up never)".to_owned(),
        };
        if self.answered {
            format!(
                "lost the coordinator at {address} ({reason}); waiting for it to come back, \
                 {wait}; jobs already leased keep computing and are reported when it is back"
            )
        } else if refused(status) {
            format!(
                "cannot reach the coordinator at {address}: connection refused. Is the \
                 coordinator running on {}:{}? Check --connect (host and port); {wait}",
                address.host(),
                address.port()
            )
        } else {
            format!(
                "cannot reach the coordinator at {address}: {reason}. Check --connect (host \
                 and port) and that the coordinator is running; {wait}"
            )
        }
    }
}

/// True when a failed call reached no coordinator (the network, a closed
/// port, a connection cut mid-call), rather than one that answered with an
/// error.
pub(crate) fn lost(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

/// A duration rounded for a log line: `45s`, `12m`, `3h20m`.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 120 {
        format!("{secs}s")
    } else if secs < 2 * 3600 {
        format!("{}m", secs / 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    }
}

/// Exponential backoff with jitter: each delay is drawn from `[d/2, d]`, where
/// `d` doubles from `initial` up to `max`. The jitter keeps a fleet of workers
/// from reconnecting in lockstep after a coordinator restart.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The delay before the next retry.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        // A fresh RandomState is seeded randomly, so this is a cheap random
        // fraction in [0.5, 1) without a dependency.
        let r = RandomState::new().build_hasher().finish();
        let fraction = 0.5 + (r >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        d.mul_f64(fraction)
    }

    /// The backoff as it stands after `failures` failed calls.
    pub(crate) fn after_failures(mut self, failures: u32) -> Backoff {
        for _ in 0..failures.min(32) {
            self.next = (self.next * 2).min(self.max);
        }
        self
    }

    /// Back to the initial delay after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// A cheap-to-clone handle on the coordinator's service.
#[derive(Clone, Debug)]
pub(crate) struct Client {
    inner: CoordinatorClient<InterceptedService<Channel, Bearer>>,
    /// The same channel, for the one call made without the generated client
    /// (see [`Client::report_batch`]).
    channel: InterceptedService<Channel, Bearer>,
    timeout: Duration,
    /// Counts the TCP connections the channel has made. A coordinator that
    /// was replaced (a new run on the same address) is only ever reached
    /// over a new connection, so a report is held back on a connection that
    /// no answer of the coordinator has vouched for (see [`ReportGate`]).
    connections: Arc<AtomicU64>,
}

/// Whether a report may go out on the connection it is about to use: only
/// when the lease loop's last successful answer came over that same
/// connection, and so told which run the coordinator at the other end
/// serves, and that run is the report's. Checked when the transport asks for
/// the report's first chunk, after it has connected; a report held back ends
/// its stream empty, and its task waits for the lease loop's next answer and
/// checks the run again.
///
/// The run is checked here too, not only by the report's task: the lease
/// loop aborts an old run's tasks when it registers in a new one, but a task
/// (or the batcher's call) already running, whose body the transport asks
/// for a moment later, would otherwise send the old run's result over the
/// connection the new run's answer has just vouched for.
#[derive(Clone, Debug)]
pub(crate) struct ReportGate {
    connections: Arc<AtomicU64>,
    /// The connection the lease loop's last successful answer came over.
    vouched: Arc<AtomicU64>,
    /// The run the lease loop is registered in now.
    session: watch::Receiver<Session>,
    /// Set when a report was held back.
    held: Arc<AtomicBool>,
}

impl ReportGate {
    /// A gate for the client's connections, vouched for by the lease loop,
    /// whose registration `session` follows.
    pub(crate) fn new(
        client: &Client,
        vouched: Arc<AtomicU64>,
        session: watch::Receiver<Session>,
    ) -> ReportGate {
        ReportGate {
            connections: Arc::clone(&client.connections),
            vouched,
            session,
            held: Arc::new(AtomicBool::new(false)),
        }
    }

    /// True when a report of run `run` may go out now; else marks it held
    /// back.
    fn open(&self, run: &str) -> bool {
        let open = self.connections.load(Ordering::SeqCst)
            == self.vouched.load(Ordering::SeqCst)
            && self.session.borrow().run == run;
        if !open {
            self.held.store(true, Ordering::SeqCst);
        }
        open
    }

    /// True (once) when the last report was held back.
    fn was_held(&self) -> bool {
        self.held.swap(false, Ordering::SeqCst)
    }
}

impl Client {
    /// A client that connects on first use and reconnects after failures, so
    /// it can be created before the coordinator is up. It speaks TLS when the
    /// address is `https://` or `config.tls` is set, and sends `config.token`
    /// on every call.
    ///
    /// # Errors
    ///
    /// [`Error::Tls`] when rustls refuses the TLS settings (for `https://`
    /// without `config.tls`: when the system has no CA certificates).
    pub(crate) fn new(config: &Config) -> Result<Client, Error> {
        let timeout = config.rpc_timeout;
        let coordinator = match config.tls {
            Some(_) => config.coordinator.clone().with_tls(),
            None => config.coordinator.clone(),
        };
        let mut endpoint = coordinator
            .endpoint()
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            // Detects a coordinator that vanished without closing the
            // connection (power loss, partition) during a long report stream.
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(20));
        if coordinator.tls() {
            let tls = match &config.tls {
                Some(tls) => tls.clone(),
                None => {
                    nq_proto::tls::ClientTls::load(None, None, None).map_err(|e| {
                        Error::Tls {
                            reason: e.to_string(),
                        }
                    })?
                }
            };
            endpoint = endpoint.tls_config(tls.config()).map_err(|e| Error::Tls {
                reason: e.to_string(),
            })?;
        }
        let bearer = Bearer(config.token.clone());
        let connections = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&connections);
        // tonic's own connector, counted: every TCP connection the channel
        // opens (the first, and each after a failure) bumps the count.
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let connector = tower::ServiceExt::map_response(http, move |io| {
            counted.fetch_add(1, Ordering::SeqCst);
            io
        });
        let channel = InterceptedService::new(
            endpoint.connect_with_connector_lazy(connector),
            bearer,
        );
        let inner = CoordinatorClient::new(channel.clone())
            .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
        Ok(Client {
            inner,
            channel,
            timeout,
            connections,
        })
    }

    /// The number of connections the channel has opened so far.
    pub(crate) fn connection(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    /// Registers with `config`'s name and threads, and `gpu_jobs`, the jobs
    /// its GPUs may hold (0 without one), as its claim.
    pub(crate) async fn register(
        &self,
        config: &Config,
        gpu_jobs: usize,
    ) -> Result<pb::RegisterResponse, Status> {
        let request = self.request(pb::RegisterRequest {
            protocol_version: nq_proto::PROTOCOL_VERSION,
            name: config.name.clone(),
            threads: u32::try_from(config.threads.get()).unwrap_or(u32::MAX),
            program_version: env!("CARGO_PKG_VERSION").to_owned(),
            gpu_jobs: u32::try_from(gpu_jobs).unwrap_or(u32::MAX),
        });
        Ok(self.inner.clone().register(request).await?.into_inner())
    }

    pub(crate) async fn lease(
        &self,
        worker: &WorkerId,
        want: u32,
        held: Vec<u64>,
    ) -> Result<pb::LeaseResponse, Status> {
        let request = self.request(pb::LeaseRequest {
            worker_id: worker.0.clone(),
            want,
            held,
        });
        Ok(self.inner.clone().lease(request).await?.into_inner())
    }

    /// Hands `leases` back; `leaving` also tells the coordinator that this
    /// worker drained and leaves the run.
    pub(crate) async fn release(
        &self,
        worker: &WorkerId,
        leases: Vec<u64>,
        leaving: bool,
    ) -> Result<u32, Status> {
        let request = self.request(pb::ReleaseRequest {
            worker_id: worker.0.clone(),
            leases,
            leaving,
        });
        Ok(self
            .inner
            .clone()
            .release(request)
            .await?
            .into_inner()
            .released)
    }

    /// Sends one report. `deadline` is off for solution streams, which last as
    /// long as the job computes.
    async fn report(
        &self,
        chunks: impl Stream<Item = pb::ReportChunk> + Send + 'static,
        deadline: bool,
    ) -> Result<pb::ReportAck, Status> {
        let mut request = tonic::Request::new(chunks);
        if deadline {
            request.set_timeout(self.timeout);
        }
        Ok(self.inner.clone().report(request).await?.into_inner())
    }

    /// Sends one `ReportBatch` call. The request is handed to the transport
    /// only when it asks for the body, after it has connected, so that `gate`
    /// decides on the connection the call really goes out on (as for a
    /// `Report`); a request held back goes out empty, and the call fails.
    /// That lazy body is why this call is made with `tonic::client::Grpc`
    /// and not the generated client, which takes the message itself: on the
    /// wire a unary call is a stream of exactly one message.
    async fn report_batch(
        &self,
        request: pb::ReportBatchRequest,
        gate: &ReportGate,
    ) -> Result<pb::ReportBatchResponse, Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
        grpc.ready().await.map_err(|e| {
            let e: tonic::codegen::StdError = e.into();
            Status::unavailable(format!("the connection is not ready: {e}"))
        })?;
        let gate = gate.clone();
        let lazy = std::iter::once_with(move || {
            let open = gate.open(&request.run_id);
            open.then_some(request)
        })
        .flatten();
        let mut call = tonic::Request::new(tokio_stream::iter(lazy));
        call.set_timeout(self.timeout);
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/nqueens.v1.Coordinator/ReportBatch",
        );
        let codec = tonic_prost::ProstCodec::default();
        Ok(grpc.client_streaming(call, path, codec).await?.into_inner())
    }
}

/// One registration: the worker id the coordinator gave and the run it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) worker: WorkerId,
    /// `RunInfo.run_id`.
    pub(crate) run: String,
}

/// What the report task shares with the lease loop.
#[derive(Debug)]
pub(crate) struct ReportCtx {
    pub(crate) client: Client,
    /// The current registration. The lease loop sends a new one after each
    /// registration; report tasks wait on it after an unknown-worker failure,
    /// and read it before every attempt.
    pub(crate) session: watch::Receiver<Session>,
    /// The run the job was leased in. A report is sent only while the
    /// current registration is in this run, and carries its id.
    pub(crate) run: String,
    /// The name of the kernel that computes the job, for `JobResult.kernel`.
    pub(crate) kernel: &'static str,
    /// Report tasks send the worker id the coordinator did not know, so that
    /// the lease loop registers again. Never closed while tasks run.
    pub(crate) stale: mpsc::UnboundedSender<WorkerId>,
    /// Whether jobs stream their solutions.
    pub(crate) solutions: bool,
    /// Delays between retries of this report.
    pub(crate) backoff: Backoff,
    /// Bumped by the lease loop at each successful answer of the
    /// coordinator; see [`wait_for_an_answer`].
    pub(crate) heard: watch::Receiver<u64>,
    /// Holds a report back on a connection no answer has vouched for.
    pub(crate) gate: ReportGate,
    /// Sends count-only results in `ReportBatch` calls while the coordinator
    /// has that rpc; `Report` is used otherwise, and always for solutions.
    pub(crate) batcher: Batcher,
    /// What the user is told while the coordinator is gone.
    pub(crate) outage: SharedOutage,
}

/// After a report failed on the network, waits until the lease loop has
/// heard from the coordinator again. The coordinator may have been replaced
/// by one serving another run: only a fresh answer (a Lease, or the Register
/// it asks for) says which run it serves now, and the report must not reach
/// another run's coordinator. Returns false when the lease loop has ended.
async fn wait_for_an_answer(ctx: &mut ReportCtx, seen: u64) -> bool {
    while *ctx.heard.borrow_and_update() == seen {
        if ctx.heard.changed().await.is_err() {
            return false;
        }
    }
    true
}

/// How a job's report task ended.
#[derive(Debug)]
pub(crate) enum JobEnd {
    /// The coordinator acknowledged the result.
    Acked {
        ack: pb::ReportAck,
        nodes: u64,
        solutions: u64,
    },
    /// The job was stopped before it finished.
    Cancelled,
    /// The solution stream broke after part of it was sent: the job must be
    /// computed again (the solutions were not kept, to bound memory).
    Rerun,
    /// The coordinator rejected the result for good.
    Rejected(Status),
    /// The coordinator refused this report with PERMISSION_DENIED (its lease
    /// is not valid for it): the result is dropped.
    Denied(Status),
    /// The coordinator refused the token: the worker must stop.
    Unauthenticated(Status),
    /// The worker registered in another run meanwhile: the result belongs to
    /// the old run and was not sent.
    OtherRun,
}

/// Identifies the job a report belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobRef {
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
}

/// Waits for the outcome of one attempt at a job and reports it, retrying
/// until the coordinator acknowledges it (a report is idempotent by job id).
///
/// `computed` is set once the pool has finished the job, so the lease loop
/// knows its thread is free again.
pub(crate) async fn report_job(
    mut ctx: ReportCtx,
    job: JobRef,
    attempt: Attempt,
    computed: Arc<AtomicBool>,
) -> JobEnd {
    if ctx.solutions {
        return stream_job(ctx, job, attempt, computed).await;
    }
    let mut output = attempt.output;
    let outcome = loop {
        match output.recv().await {
            Some(Produced::Done(outcome)) => break outcome,
            Some(Produced::Solutions { .. }) => continue,
            None => return JobEnd::Cancelled,
        }
    };
    computed.store(true, Ordering::Relaxed);
    let JobOutcome::Done {
        counts,
        nodes,
        solutions,
    } = outcome
    else {
        return JobEnd::Cancelled;
    };
    let result = pb::JobResult {
        counts: counts.iter().map(pb::SubCounts::from).collect(),
        nodes,
        solutions_sent: 0,
        kernel: ctx.kernel.to_owned(),
    };
    let mut registered_again = false;
    loop {
        let heard = *ctx.heard.borrow_and_update();
        let session = ctx.session.borrow_and_update().clone();
        // Checked before every attempt: a result of an earlier run must never
        // reach the coordinator of a later one.
        if session.run != ctx.run {
            return JobEnd::OtherRun;
        }
        let worker = session.worker;
        let sent = send_result(&ctx, &worker, job, &result).await;
        let failure = match sent {
            Sent::Acked(ack) => {
                return JobEnd::Acked {
                    ack,
                    nodes,
                    solutions,
                };
            }
            Sent::Held => {
                // Nothing was sent: the connection is new, and may lead to a
                // coordinator of another run. The next answer tells.
                debug!(job = job.job.0, "report held back on a new connection");
                if !wait_for_an_answer(&mut ctx, heard).await {
                    return JobEnd::Cancelled;
                }
                continue;
            }
            // At once, with Report.
            Sent::Unsupported => continue,
            Sent::Failed(status) => status,
        };
        match Failure::of(&failure) {
            Failure::Retry => {
                let delay = ctx.backoff.next_delay();
                note_retry(&ctx, job, &failure, delay);
                tokio::time::sleep(delay).await;
                if !wait_for_an_answer(&mut ctx, heard).await {
                    return JobEnd::Cancelled;
                }
            }
            // The lease loop meets the same TLS failure and stops the worker;
            // until then this report waits like any unreachable one.
            Failure::Tls(reason) => {
                let delay = ctx.backoff.next_delay();
                warn!(job = job.job.0, %reason, ?delay, "report failed in TLS; retrying");
                tokio::time::sleep(delay).await;
            }
            // One new registration per report: if the coordinator refuses the
            // report under the fresh id too, it is the report it refuses.
            Failure::Register if !registered_again => {
                registered_again = true;
                if !wait_for_new_session(&mut ctx, worker).await {
                    return JobEnd::Cancelled;
                }
            }
            Failure::Denied => return JobEnd::Denied(failure),
            Failure::Token => return JobEnd::Unauthenticated(failure),
            Failure::Register | Failure::Fatal => return JobEnd::Rejected(failure),
        }
    }
}

/// Sends `result` of `job` once, as `worker`: through the batcher when the
/// coordinator takes batches, else as a `Report` call of its own.
async fn send_result(
    ctx: &ReportCtx,
    worker: &WorkerId,
    job: JobRef,
    result: &pb::JobResult,
) -> Sent {
    if ctx.batcher.supported() {
        return ctx.batcher.send(worker, &ctx.run, job, result).await;
    }
    let chunk = chunk(worker, &ctx.run, job, Body::Result(result.clone()));
    // The chunk is produced when the transport asks for it, after it has
    // connected: the gate then knows which connection it goes out on.
    let (gate, run) = (ctx.gate.clone(), ctx.run.clone());
    let lazy = std::iter::once_with(move || gate.open(&run).then_some(chunk)).flatten();
    match ctx.client.report(tokio_stream::iter(lazy), true).await {
        Ok(ack) => Sent::Acked(ack),
        Err(_) if ctx.gate.was_held() => Sent::Held,
        Err(status) => Sent::Failed(status),
    }
}

/// Logs a report of `job` that failed with `failure` and is retried after
/// `delay`. When the coordinator is gone, that is said once for the worker
/// (the outage), and for each report at debug.
fn note_retry(ctx: &ReportCtx, job: JobRef, failure: &Status, delay: Duration) {
    if lost(failure) {
        debug!(
            job = job.job.0,
            code = ?failure.code(),
            message = failure.message(),
            ?delay,
            "report failed; retrying once the coordinator answers again"
        );
        lock(&ctx.outage).failed(failure);
    } else {
        warn!(
            job = job.job.0,
            code = ?failure.code(),
            message = failure.message(),
            ?delay,
            "report failed; retrying once the coordinator answers again"
        );
    }
}

/// Solutions mode: the report stream opens with the job's first output and
/// carries its batches as the pool produces them, then the result.
async fn stream_job(
    mut ctx: ReportCtx,
    job: JobRef,
    attempt: Attempt,
    computed: Arc<AtomicBool>,
) -> JobEnd {
    let Attempt {
        mut output, stop, ..
    } = attempt;
    // Waiting for the first output keeps queued jobs from holding idle streams.
    let first = match output.recv().await {
        None | Some(Produced::Done(JobOutcome::Cancelled)) => return JobEnd::Cancelled,
        Some(first) => first,
    };
    let heard = *ctx.heard.borrow_and_update();
    let session = ctx.session.borrow_and_update().clone();
    if session.run != ctx.run {
        stop.store(true, Ordering::Relaxed);
        return JobEnd::OtherRun;
    }
    let worker = session.worker;
    let sent = Arc::new(OnceLock::new());
    let stream = ReportStream {
        first: Some(first),
        output,
        worker: worker.clone(),
        run: ctx.run.clone(),
        kernel: ctx.kernel,
        gate: Some(ctx.gate.clone()),
        job,
        sent: Arc::clone(&sent),
        computed,
    };
    let result = ctx.client.report(stream, false).await;
    match (result, sent.get()) {
        (Ok(ack), Some(&(nodes, solutions))) => JobEnd::Acked {
            ack,
            nodes,
            solutions,
        },
        // The stream ended without a result: the job was stopped.
        (Ok(_), None) => JobEnd::Cancelled,
        (Err(status), _) => {
            // The stream and its receiver are gone, so the pool threads stop
            // this attempt on their next send; a new attempt recomputes it.
            stop.store(true, Ordering::Relaxed);
            if ctx.gate.was_held() {
                // Nothing was sent on a connection no answer vouched for.
                if !wait_for_an_answer(&mut ctx, heard).await {
                    return JobEnd::Cancelled;
                }
                return JobEnd::Rerun;
            }
            match Failure::of(&status) {
                Failure::Fatal => return JobEnd::Rejected(status),
                Failure::Denied => return JobEnd::Denied(status),
                Failure::Token => return JobEnd::Unauthenticated(status),
                Failure::Register => {
                    if !wait_for_new_session(&mut ctx, worker).await {
                        return JobEnd::Cancelled;
                    }
                }
                Failure::Retry | Failure::Tls(_) => {
                    let delay = ctx.backoff.next_delay();
                    if lost(&status) {
                        lock(&ctx.outage).failed(&status);
                    }
                    warn!(
                        job = job.job.0,
                        code = ?status.code(),
                        message = status.message(),
                        ?delay,
                        "solution stream failed; recomputing the job once the coordinator answers again"
                    );
                    tokio::time::sleep(delay).await;
                    if !wait_for_an_answer(&mut ctx, heard).await {
                        return JobEnd::Cancelled;
                    }
                }
            }
            JobEnd::Rerun
        }
    }
}

/// Asks the lease loop to register again and waits until it has. False when
/// the lease loop is gone.
async fn wait_for_new_session(ctx: &mut ReportCtx, stale: WorkerId) -> bool {
    debug!(worker = %stale.0, "coordinator does not know this worker; registering again");
    if ctx.stale.send(stale).is_err() {
        return false;
    }
    ctx.session.changed().await.is_ok()
}

/// One chunk of a report of `job`, leased in run `run`.
fn chunk(worker: &WorkerId, run: &str, job: JobRef, body: Body) -> pb::ReportChunk {
    pb::ReportChunk {
        worker_id: worker.0.clone(),
        job_id: job.job.0,
        lease_id: job.lease.0,
        body: Some(body),
        run_id: run.to_owned(),
    }
}

/// The chunks of one job's report, read from its pool output as they come.
struct ReportStream {
    /// The output that opened the stream, sent first.
    first: Option<Produced>,
    /// The job's pool output.
    output: mpsc::Receiver<Produced>,
    worker: WorkerId,
    /// The run the job was leased in.
    run: String,
    /// The kernel that computes the job.
    kernel: &'static str,
    /// Checked once, before the first chunk (see [`ReportGate`]).
    gate: Option<ReportGate>,
    job: JobRef,
    /// The job's nodes and solutions, set when the result chunk is yielded;
    /// the stream ends after it.
    sent: Arc<OnceLock<(u64, u64)>>,
    /// Set when the pool finished the job.
    computed: Arc<AtomicBool>,
}

impl Stream for ReportStream {
    type Item = pb::ReportChunk;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        if self.sent.get().is_some() {
            return Poll::Ready(None);
        }
        if let Some(gate) = self.gate.take()
            && !gate.open(&self.run)
        {
            // Held back: the stream ends before its first chunk.
            return Poll::Ready(None);
        }
        let produced = match self.first.take() {
            Some(p) => p,
            None => match self.output.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(p)) => p,
            },
        };
        let body = match produced {
            Produced::Solutions { sub, rows } => Body::Solutions(pb::SolutionBatch {
                subproblem: sub,
                rows,
            }),
            Produced::Done(JobOutcome::Done {
                counts,
                nodes,
                solutions,
            }) => {
                self.computed.store(true, Ordering::Relaxed);
                let _ = self.sent.set((nodes, solutions));
                Body::Result(pb::JobResult {
                    counts: counts.iter().map(pb::SubCounts::from).collect(),
                    nodes,
                    solutions_sent: solutions,
                    kernel: self.kernel.to_owned(),
                })
            }
            // Ending without a result makes the coordinator discard the stream.
            Produced::Done(JobOutcome::Cancelled) => {
                self.computed.store(true, Ordering::Relaxed);
                return Poll::Ready(None);
            }
        };
        Poll::Ready(Some(chunk(&self.worker, &self.run, self.job, body)))
    }
}

/// Describes a report acknowledgement for logs.
pub(crate) fn outcome_name(ack: &pb::ReportAck) -> &'static str {
    match ack.outcome() {
        Outcome::Accepted => "accepted",
        Outcome::Confirmed => "confirmed",
        Outcome::Conflict => "conflict",
        Outcome::Unspecified => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What tonic gives for a call whose connection failed with `kind`.
    fn connect_failed(kind: std::io::ErrorKind) -> Status {
        Status::from_error(Box::new(std::io::Error::from(kind)))
    }

    /// The outage of a worker of `coordinator` with `--give-up give_up`.
    fn outage(coordinator: &str, give_up: Option<Duration>) -> Outage {
        let mut config = Config::new(coordinator.parse().unwrap());
        config.give_up = give_up;
        Outage::new(&config)
    }

    #[test]
    fn a_refused_connection_says_what_to_check() {
        let ten_minutes = outage("127.0.0.1:50999", Some(Duration::from_secs(600)));
        let refused = connect_failed(std::io::ErrorKind::ConnectionRefused);
        let now = ten_minutes.last_answer;
        assert_eq!(
            ten_minutes.first_words(&refused, now),
            "cannot reach the coordinator at http://127.0.0.1:50999: connection refused. \
             Is the coordinator running on 127.0.0.1:50999? Check --connect (host and \
             port); retrying for up to 10m (--give-up), then the worker stops"
        );
        let forever = outage("127.0.0.1:50999", None);
        let timed_out = connect_failed(std::io::ErrorKind::TimedOut);
        assert_eq!(
            forever.first_words(&timed_out, now),
            "cannot reach the coordinator at http://127.0.0.1:50999: the connection timed \
             out. Check --connect (host and port) and that the coordinator is running; \
             retrying with no time limit (--give-up never)"
        );
        // No I/O error behind it: the status message.
        assert_eq!(
            unreachable_reason(&Status::unavailable("tcp connect error")),
            "tcp connect error"
        );
    }

    #[test]
    fn a_lost_coordinator_is_waited_for_with_the_time_left() {
        let mut lost = outage("coord.example:7000", Some(Duration::from_secs(600)));
        lost.answered();
        let refused = connect_failed(std::io::ErrorKind::ConnectionRefused);
        // 70 s after its last answer.
        let now = lost.last_answer + Duration::from_secs(70);
        assert_eq!(
            lost.first_words(&refused, now),
            "lost the coordinator at http://coord.example:7000 (connection refused); \
             waiting for it to come back, for up to 8m more (--give-up 10m), then the \
             worker stops; jobs already leased keep computing and are reported when it is \
             back"
        );
        let mut forever = outage("coord.example:7000", None);
        forever.answered();
        assert!(forever.first_words(&refused, now).contains(
            "waiting for it to come back, with no time limit (--give-up never)"
        ));
    }

    #[test]
    fn only_calls_that_reached_no_coordinator_are_an_outage() {
        assert!(lost(&connect_failed(std::io::ErrorKind::ConnectionRefused)));
        assert!(lost(&Status::unavailable("tcp connect error")));
        assert!(lost(&Status::deadline_exceeded("slow")));
        // The coordinator answered, with an error a pause fixes.
        assert!(!lost(&Status::resource_exhausted("busy")));
        assert!(!lost(&Status::internal("store")));
    }

    #[test]
    fn short_durations_for_log_lines() {
        assert_eq!(short(Duration::from_millis(45_900)), "45s");
        assert_eq!(short(Duration::from_secs(119)), "119s");
        assert_eq!(short(Duration::from_secs(12 * 60 + 5)), "12m");
        assert_eq!(short(Duration::from_secs(3 * 3600 + 20 * 60)), "3h20m");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let delays: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        let caps = [100, 200, 400, 800, 800, 800];
        for (d, cap) in delays.iter().zip(caps) {
            let cap = Duration::from_millis(cap);
            assert!(*d <= cap && *d >= cap / 2, "{d:?} vs {cap:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
        let mut later =
            Backoff::new(Duration::from_millis(100), Duration::from_millis(800))
                .after_failures(2);
        assert!(later.next_delay() >= Duration::from_millis(200));
    }

    #[test]
    fn the_gate_opens_only_for_the_vouched_connection_and_the_registered_run() {
        let session = watch::Sender::new(Session {
            worker: WorkerId("w1".into()),
            run: "run-a".into(),
        });
        let gate = ReportGate {
            connections: Arc::new(AtomicU64::new(1)),
            vouched: Arc::new(AtomicU64::new(1)),
            session: session.subscribe(),
            held: Arc::new(AtomicBool::new(false)),
        };
        assert!(gate.open("run-a"));
        assert!(!gate.was_held());
        // The coordinator went away; the channel opened a new connection
        // that no answer has vouched for yet.
        gate.connections.store(2, Ordering::SeqCst);
        assert!(!gate.open("run-a"));
        assert!(gate.was_held());
        // The lease loop registered in another run over it: a report of the
        // old run (from a task aborted too late, or the batcher) stays held.
        session.send_replace(Session {
            worker: WorkerId("w2".into()),
            run: "run-b".into(),
        });
        gate.vouched.store(2, Ordering::SeqCst);
        assert!(!gate.open("run-a"));
        assert!(gate.was_held());
        assert!(gate.open("run-b"));
    }

    #[test]
    fn tls_records_are_told_from_http2_frames() {
        // The alert a TLS server sends a plain-text client, and a ServerHello.
        assert!(is_tls_record([0x15, 0x03, 0x03]));
        assert!(is_tls_record([0x16, 0x03, 0x01]));
        // An HTTP/2 server's first frame: SETTINGS, a length of 0 to 36 bytes.
        assert!(!is_tls_record([0x00, 0x00, 0x12]));
        assert!(!is_tls_record(*b"HTT"));
    }

    #[test]
    fn failures_sort_into_retry_register_fatal() {
        assert_eq!(Failure::of(&Status::unavailable("x")), Failure::Retry);
        assert_eq!(Failure::of(&Status::deadline_exceeded("x")), Failure::Retry);
        assert_eq!(Failure::of(&Status::internal("x")), Failure::Retry);
        assert_eq!(
            Failure::of(&Status::failed_precondition("x")),
            Failure::Register
        );
        assert_eq!(Failure::of(&Status::invalid_argument("x")), Failure::Fatal);
        assert_eq!(
            Failure::of(&Status::permission_denied("x")),
            Failure::Denied
        );
        assert_eq!(Failure::of(&Status::unauthenticated("x")), Failure::Token);
    }
}
