//! The gRPC calls in flight, counted, so that shutdown waits for calls and
//! not for connections.
//!
//! At shutdown the server stops accepting connections and asks each open one
//! to close (HTTP/2 GOAWAY, then a PING that the client must answer before
//! the connection ends). A client that never answers (a half-open
//! connection, a worker frozen by a debugger, a port scanner that sent the
//! HTTP/2 preface) would hold the server's graceful shutdown, and so the
//! coordinator's exit, for the whole drain timeout, although no call was
//! left to finish. [`InFlight`] counts calls from the moment the server
//! hands a request to the services until the last byte of the response body
//! is sent (or the response is dropped); the shutdown step waits for that
//! count to reach zero instead of waiting for every connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use tokio::sync::Notify;
use tonic::codegen::http;

/// A shared count of the calls in flight; clones share it. As a
/// [`tower::Layer`] it wraps the server's routes and counts every call
/// (health and reflection included).
#[derive(Clone, Debug, Default)]
pub(crate) struct InFlight {
    count: Arc<AtomicUsize>,
    /// Signalled by the call that brings the count to zero; waited on by
    /// [`InFlight::idle`].
    idle: Arc<Notify>,
}

impl InFlight {
    /// Calls in flight now.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Returns once no call is in flight (at once when none is).
    pub(crate) async fn idle(&self) {
        loop {
            // Registered before the count is read, so that a call ending in
            // between still wakes this waiter.
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Counts one call until the returned guard is dropped.
    fn enter(&self) -> Call {
        self.count.fetch_add(1, Ordering::SeqCst);
        Call(self.clone())
    }
}

/// One call in flight; dropping it ends the call.
#[derive(Debug)]
struct Call(InFlight);

impl Drop for Call {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl<S> tower::Layer<S> for InFlight {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            in_flight: self.clone(),
        }
    }
}

/// A service whose calls [`InFlight`] counts.
#[derive(Clone, Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    in_flight: InFlight,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = self.in_flight.enter();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            // The guard rides in the body: a streamed or large answer is still
            // in flight until the server has sent it and dropped the body.
            Ok(response.map(|body| {
                tonic::body::Body::new(body.map_frame(move |frame| {
                    let _in_flight = &call;
                    frame
                }))
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Layer, Service, ServiceExt};

    use super::*;

    /// A service that answers with a one-frame body.
    fn echo() -> impl tower::Service<
        http::Request<()>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future = impl Future + Send + 'static,
    > + Clone {
        tower::service_fn(|_: http::Request<()>| async {
            let body =
                http_body_util::Full::new(tonic::codegen::Bytes::from_static(b"x"));
            Ok::<_, Infallible>(http::Response::new(tonic::body::Body::new(body)))
        })
    }

    #[tokio::test]
    async fn a_call_counts_until_its_body_is_dropped() {
        let in_flight = InFlight::default();
        let mut service = in_flight.layer(echo());
        in_flight.idle().await;
        let response = service
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        // Answered, but the body is not sent yet.
        assert_eq!(in_flight.count(), 1);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.idle().await }
        });
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"x");
        waiter.await.unwrap();
        assert_eq!(in_flight.count(), 0);
    }

    #[tokio::test]
    async fn a_call_dropped_before_its_answer_ends() {
        let in_flight = InFlight::default();
        let mut service = in_flight.layer(echo());
        let pending = service.ready().await.unwrap().call(http::Request::new(()));
        assert_eq!(in_flight.count(), 1);
        drop(pending);
        assert_eq!(in_flight.count(), 0);
        in_flight.idle().await;
    }
}
