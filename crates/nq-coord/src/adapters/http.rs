//! The coordinator's HTTP port (`--metrics ADDR`), for people and monitoring:
//!
//! * `GET /metrics`: Prometheus metrics ([`crate::metrics`]);
//! * `GET /status.json`: the run's [`Snapshot`] as JSON
//!   ([`Snapshot::to_json`], the same picture as the `Status` rpc), every
//!   worker listed; `GET /status.json?workers=K` lists at most K workers
//!   and K faulty ones and counts the rest (the status page asks for 200);
//! * `GET /`: the status page, one self-contained HTML file (inline CSS and
//!   JS, nothing fetched from elsewhere) that polls `/status.json`;
//! * gRPC over HTTP/2 (h2c), for operators: the coordinator's `Status` and
//!   the `grpc.health.v1` check, so that `nq-coord status --connect` and
//!   `nq-coord health --connect` at this port answer however busy the
//!   workers keep the workers' port. Only `Status` reaches the
//!   coordinator's service here ([`CoordinatorService`]); a worker's call
//!   is refused, since the port has neither the workers' token nor their
//!   TLS.
//!
//! Every answer is built from one snapshot under the scheduler's lock, held
//! for microseconds (the engine's core lock); nothing here can change the
//! run. It runs on a thread of its own ([`serve_apart`]), so that it
//! answers at once however busy the workers keep the coordinator. The port
//! serves plain
//! HTTP/1.1: put it behind a proxy, or bind it to a private address, where
//! the workers' names and addresses must not be public.
//!
//! [`Snapshot`]: crate::core::status::Snapshot
//! [`Snapshot::to_json`]: crate::core::status::Snapshot::to_json
//! [`CoordinatorService`]: crate::adapters::grpc::CoordinatorService

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{Html, IntoResponse};
use axum::routing::{any, get};
use nq_proto::pb::coordinator_server::CoordinatorServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tower::ServiceExt;
use tracing::info;

use crate::adapters::grpc::CoordinatorService;
use crate::engine::Engine;
use crate::error::{Error, Result};

/// The status page, built into the binary.
const STATUS_PAGE: &str = include_str!("../status_page.html");

/// Serves the HTTP port on `listener` until `token` is cancelled, on a
/// thread of its own with its own single-threaded runtime; returns when
/// that thread is done.
///
/// Not on the coordinator's runtime: a thousand busy workers keep its
/// queue full, and a scrape queued behind their calls took 100–200 ms in
/// the 10^8 run (BENCHMARKS.md §26), where a snapshot takes microseconds.
/// On its own thread, the kernel's scheduler gives a request a core within
/// a time slice, whatever the runtime's queue holds.
///
/// # Errors
///
/// [`Error::Io`] when the thread or its runtime cannot start, or accepting
/// connections fails.
pub(crate) async fn serve_apart(
    engine: Arc<Engine>,
    listener: Arc<std::net::TcpListener>,
    health: HealthReporter,
    token: CancellationToken,
) -> Result<()> {
    let io = |context: &'static str| {
        move |source| Error::Io {
            context: context.into(),
            source,
        }
    };
    let (done, served) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("nq-http".into())
        .spawn(move || {
            let served = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(io("cannot start the HTTP port's runtime"))
                .and_then(|rt| {
                    rt.block_on(async {
                        // Registered with this thread's runtime, which
                        // drives its I/O.
                        serve(engine, self::listener(&listener)?, health, token).await
                    })
                });
            // The receiver is gone only if the coordinator stopped waiting.
            let _ = done.send(served);
        })
        .map_err(io("cannot start the HTTP port's thread"))?;
    served.await.unwrap_or(Ok(()))
}

/// Serves the HTTP port on `listener` until `token` is cancelled, then lets
/// open requests finish. `health` is the workers' port's health reporter:
/// both ports give the same answer.
///
/// # Errors
///
/// [`Error::Io`] when accepting connections fails.
async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    health: HealthReporter,
    token: CancellationToken,
) -> Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /status.json, the status page, and Status and health over gRPC");
    }
    let coordinator =
        CoordinatorServer::new(CoordinatorService::new(Arc::clone(&engine)))
            .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
    let health = HealthServer::new(HealthService::from_health_reporter(health));
    let app = Router::new()
        .route("/", get(page))
        .route("/status.json", get(status_json))
        .route("/metrics", get(metrics))
        .with_state(engine)
        // The one call of the coordinator's service served here; its
        // other calls take the route after it.
        .route_service(
            &grpc_call(&coordinator, "Status"),
            grpc(coordinator.clone()),
        )
        .route(&grpc_call(&coordinator, "{*call}"), any(workers_elsewhere))
        .route_service(&grpc_call(&health, "{*call}"), grpc(health))
        .fallback(|| async { StatusCode::NOT_FOUND });
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(token.clone().cancelled_owned());
    // Graceful shutdown waits for every open connection, and a client that
    // never finishes its request would hold the coordinator's shutdown up:
    // after DRAIN the server is dropped, whatever is still open.
    let deadline = async {
        token.cancelled().await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::select! {
        r = server => r.map_err(|source| Error::Io {
            context: "the HTTP server (--metrics) failed".into(),
            source,
        }),
        () = deadline => Ok(()),
    }
}

/// The tokio form of the caller's bound HTTP listener (a duplicate of its
/// socket, so that the caller's copy may stay in the config).
fn listener(l: &std::net::TcpListener) -> Result<TcpListener> {
    let io = |source| Error::Io {
        context: "cannot use the --metrics listener".into(),
        source,
    };
    let l = l.try_clone().map_err(io)?;
    l.set_nonblocking(true).map_err(io)?;
    TcpListener::from_std(l).map_err(io)
}

/// The route of a service's `call` (a method, or `{*call}` for all),
/// `/package.Service/call`.
fn grpc_call<S: NamedService>(_: &S, call: &str) -> String {
    format!("/{}/{call}", S::NAME)
}

/// What a worker that called the HTTP port is told.
async fn workers_elsewhere() -> axum::response::Response {
    tonic::Status::unimplemented(
        "this is the coordinator's HTTP port (--metrics), which answers Status and \
         health checks only: workers connect to its --listen port",
    )
    .into_http()
}

/// A tonic service as an axum route: the same request, its body in
/// tonic's type.
fn grpc<S>(
    service: S,
) -> impl tower::Service<
    axum::extract::Request,
    Response = S::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static
where
    S: tower::Service<
            axum::http::Request<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    service.map_request(|req: axum::extract::Request| req.map(tonic::body::Body::new))
}

/// How long open HTTP requests get to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(2);

/// Every answer describes this instant: no cache may keep it.
const NO_STORE: (axum::http::HeaderName, &str) = (CACHE_CONTROL, "no-store");

async fn page() -> impl IntoResponse {
    ([NO_STORE], Html(STATUS_PAGE))
}

async fn status_json(
    State(engine): State<Arc<Engine>>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let cap = match listing_cap(uri.query()) {
        Ok(cap) => cap,
        Err(message) => {
            return (StatusCode::BAD_REQUEST, [NO_STORE], message).into_response();
        }
    };
    let body = engine.snapshot().to_json_listing(cap).to_string();
    ([(CONTENT_TYPE, "application/json"), NO_STORE], body).into_response()
}

/// The cap on the workers listed that `/status.json`'s query asks for:
/// `workers=K` (K from 0), or every worker without it.
///
/// # Errors
///
/// A message naming the parameter refused and the accepted form.
fn listing_cap(query: Option<&str>) -> std::result::Result<usize, String> {
    let mut cap = usize::MAX;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "workers" {
            return Err(format!(
                "unknown parameter {key:?}: /status.json takes workers=K, the most workers to list \
                 (every one without it)\n"
            ));
        }
        cap = value.parse().map_err(|_| {
            format!("workers={value:?} is not a count: give workers=K with K a whole number from 0\n")
        })?;
    }
    Ok(cap)
}

async fn metrics(State(engine): State<Arc<Engine>>) -> impl IntoResponse {
    let body = crate::metrics::render(&engine.snapshot());
    (
        [(CONTENT_TYPE, crate::metrics::CONTENT_TYPE), NO_STORE],
        body,
    )
}
