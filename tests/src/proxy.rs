//! [`Proxy`]: a TCP proxy on 127.0.0.1 that a test puts between a worker and
//! its coordinator, to drop the worker's connections or stall its traffic at
//! the moments the test chooses.
//!
//! It forwards bytes, nothing more: it knows nothing of HTTP/2 or gRPC, so
//! what the worker and coordinator see is exactly what a flaky network or a
//! stateful firewall does to them (a connection closed under a call, a call
//! whose bytes arrive late).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A running proxy. Dropping it closes its port and every connection.
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect (127.0.0.1, an ephemeral port).
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    /// Cancelled on drop: stops the accept loop and every connection.
    stop: CancellationToken,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    /// True while traffic is held. Pumps wait on it before each write; the
    /// test flips it with [`Proxy::stall`] and [`Proxy::resume`].
    stalled: watch::Sender<bool>,
    /// The token of the current connections. [`Proxy::drop_connections`]
    /// cancels it (closing them) and puts a fresh one here for new ones.
    generation: Mutex<CancellationToken>,
    /// Connections accepted so far; a watch so tests can wait for a
    /// reconnection.
    accepted: watch::Sender<u64>,
    /// Connections open now.
    open: AtomicU64,
    /// Bytes read from either side; a watch so tests can wait until bytes
    /// sent during a stall have reached the proxy.
    read: watch::Sender<u64>,
    /// Bytes written to either side.
    forwarded: watch::Sender<u64>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards every connection to `upstream`.
    ///
    /// # Errors
    ///
    /// When the port cannot be bound.
    pub async fn start(upstream: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("proxy cannot bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            stalled: watch::Sender::new(false),
            generation: Mutex::new(CancellationToken::new()),
            accepted: watch::Sender::new(0),
            open: AtomicU64::new(0),
            read: watch::Sender::new(0),
            forwarded: watch::Sender::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, Arc::clone(&shared), stop.clone()));
        Ok(Proxy { addr, shared, stop })
    }

    /// Holds every byte in both directions, on open and new connections,
    /// until [`Proxy::resume`]. Connections stay open: to both ends the peer
    /// looks alive but silent.
    pub fn stall(&self) {
        self.shared.stalled.send_replace(true);
    }

    /// Forwards again, starting with the bytes held during the stall.
    pub fn resume(&self) {
        self.shared.stalled.send_replace(false);
    }

    /// Closes every open connection (both sides see the close) and returns
    /// how many there were. Later connections are forwarded normally.
    pub fn drop_connections(&self) -> u64 {
        let open = self.shared.open.load(Ordering::SeqCst);
        let old = std::mem::replace(
            &mut *self
                .shared
                .generation
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
            self.stop.child_token(),
        );
        old.cancel();
        open
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        *self.shared.accepted.borrow()
    }

    /// Bytes forwarded so far, both directions together.
    pub fn forwarded(&self) -> u64 {
        *self.shared.forwarded.borrow()
    }

    /// Waits until the proxy has forwarded at least `n` bytes in all.
    pub async fn wait_forwarded(&self, n: u64) {
        let mut rx = self.shared.forwarded.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|&f| f >= n).await;
    }

    /// Waits until the proxy has read at least `n` bytes in all, both
    /// directions together (forwarded or held).
    pub async fn wait_read(&self, n: u64) {
        let mut rx = self.shared.read.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|&r| r >= n).await;
    }

    /// Waits until at least `n` connections have been accepted in all (for
    /// instance, one more than before a drop: the client reconnected).
    pub async fn wait_accepted(&self, n: u64) {
        let mut rx = self.shared.accepted.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|&a| a >= n).await;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared
            .generation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cancel();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // A failed accept (out of descriptors) drops that one client,
                // as a real middlebox would.
                Err(_) => continue,
            },
        };
        let token = shared
            .generation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        shared.accepted.send_modify(|a| *a += 1);
        tokio::spawn(connection(client, Arc::clone(&shared), token));
    }
}

/// Forwards one client connection until either side closes or the token is
/// cancelled; then both sockets are dropped, which closes them.
async fn connection(client: TcpStream, shared: Arc<Shared>, token: CancellationToken) {
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        // Upstream down (a coordinator restarting): the client sees its
        // connection closed, as it would without the proxy.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    shared.open.fetch_add(1, Ordering::SeqCst);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, &shared, token.clone());
    let down = pump(sr, cw, &shared, token.clone());
    tokio::select! {
        () = token.cancelled() => {}
        // One direction ending (a close or an error) ends the connection, so a
        // half-closed peer is not kept waiting by the proxy.
        () = async { tokio::join!(up, down); } => {}
    }
    shared.open.fetch_sub(1, Ordering::SeqCst);
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    token: CancellationToken,
) {
    let mut stalled = shared.stalled.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            () = token.cancelled() => return,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
        };
        shared.read.send_modify(|r| *r += n as u64);
        // Hold the bytes while stalled; the sender is owned by the proxy, so
        // an error means the proxy is gone.
        tokio::select! {
            () = token.cancelled() => return,
            held = stalled.wait_for(|s| !s) => if held.is_err() { return },
        }
        tokio::select! {
            () = token.cancelled() => return,
            written = to.write_all(&buf[..n]) => if written.is_err() { return },
        }
        shared.forwarded.send_modify(|f| *f += n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the proxy: bytes pass, a stall holds them, a
    /// drop closes the connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forwards_stalls_and_drops() -> Result<()> {
        let echo = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = echo.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let proxy = Proxy::start(upstream).await?;
        let mut c = TcpStream::connect(proxy.addr).await?;
        c.write_all(b"ping").await?;
        let mut got = [0u8; 4];
        c.read_exact(&mut got).await?;
        assert_eq!(&got, b"ping");
        proxy.wait_accepted(1).await;

        // Both directions of the ping are counted before the stall.
        proxy.wait_forwarded(8).await;
        proxy.stall();
        let before = proxy.forwarded();
        c.write_all(b"held").await?;
        // The proxy has the bytes and has not passed them on.
        proxy.wait_read(8 + 4).await;
        assert_eq!(proxy.forwarded(), before, "bytes passed a stalled proxy");
        proxy.resume();
        c.read_exact(&mut got).await?;
        assert_eq!(&got, b"held");

        let mut one = [0u8; 1];
        assert_eq!(proxy.drop_connections(), 1);
        // The proxy closed the connection: the client reads end-of-stream.
        assert_eq!(c.read(&mut one).await.unwrap_or(0), 0);
        let mut again = TcpStream::connect(proxy.addr).await?;
        proxy.wait_accepted(2).await;
        again.write_all(b"back").await?;
        again.read_exact(&mut got).await?;
        assert_eq!(&got, b"back");
        Ok(())
    }
}
