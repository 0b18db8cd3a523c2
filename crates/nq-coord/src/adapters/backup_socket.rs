//! The backup socket: `backup.sock` in the data directory, on which a serving
//! coordinator takes a backup of its own store when `nq-coord backup` asks.
//!
//! sled locks a store to one process, so while a run serves, only its
//! coordinator can read the store. A Unix socket beside the store reaches it
//! with nothing more than the data directory's path, and is as private as
//! that directory: it is created with mode 0600, so only the coordinator's
//! own user can connect, and that user can read the store's files anyway.
//!
//! # Protocol
//!
//! One JSON line each way per connection. The request names the file to
//! write, as an absolute path on this machine: `{"backup_to": "/path"}`. The
//! answer is `{"ok": {"run_id": .., "n": .., "jobs": .., "jobs_done": ..,
//! "taken_unix_ms": .., "entries": .., "sha256": ..}}` once the backup is
//! written and synced, or `{"error": "message"}`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nq_store::backup::{BackupInfo, FORMAT_VERSION};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::engine::Engine;
use crate::error::{Error, Result};

/// The socket's file name in the data directory.
pub(crate) const SOCKET: &str = "backup.sock";

/// How long a client gets to send its request.
const REQUEST_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Longest request read, in bytes (a path and a little JSON).
const MAX_REQUEST: u64 = 64 * 1024;

/// Binds `dir/backup.sock` (replacing a stale one: this process holds the
/// store's lock, so no other coordinator serves `dir`). `None`, with a
/// warning, when it cannot be bound (a path longer than a socket address
/// allows, a file system without sockets): the run serves without it, and
/// `nq-coord backup` then says so.
pub(crate) fn bind(dir: &Path) -> Option<(UnixListener, PathBuf)> {
    let path = dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let bound = UnixListener::bind(&path).and_then(|l| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(l)
    });
    match bound {
        Ok(listener) => Some((listener, path)),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot open the backup socket; `nq-coord backup` cannot reach this run while it serves");
            None
        }
    }
}

/// Answers backup requests on `listener` until `token` is cancelled, then
/// removes the socket file.
pub(crate) async fn serve(
    engine: Arc<Engine>,
    listener: UnixListener,
    path: PathBuf,
    token: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = token.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "backup socket: accept failed");
                    continue;
                }
            },
        };
        // One request at a time: backups queue on the write gate anyway.
        if let Err(e) = answer(&engine, stream).await {
            debug!(error = %e, "backup socket: the client went away");
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// Reads one request, takes the backup, writes the answer.
async fn answer(engine: &Engine, stream: UnixStream) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    // A client that connects and sends nothing must not hold the socket.
    let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST));
    tokio::time::timeout(REQUEST_PATIENCE, reader.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let reply = match requested_path(&line) {
        Ok(path) => match engine.backup(path).await {
            Ok(info) => json!({ "ok": info_json(&info) }),
            Err(e) => json!({ "error": e.chain() }),
        },
        Err(message) => json!({ "error": message }),
    };
    write.write_all(format!("{reply}\n").as_bytes()).await?;
    write.shutdown().await
}

fn requested_path(line: &str) -> std::result::Result<PathBuf, String> {
    let accepted = r#"accepted: {"backup_to": "/absolute/path"}"#;
    let value: Value = serde_json::from_str(line)
        .map_err(|e| format!("the request is not JSON ({e}); {accepted}"))?;
    let path = value
        .get("backup_to")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .ok_or_else(|| format!("the request names no backup_to; {accepted}"))?;
    if !path.is_absolute() {
        return Err(format!(
            "backup_to {} is not absolute; {accepted}",
            path.display()
        ));
    }
    Ok(path)
}

fn info_json(info: &BackupInfo) -> Value {
    json!({
        "run_id": info.run_id,
        "n": info.n,
        "jobs": info.jobs,
        "jobs_done": info.jobs_done,
        "taken_unix_ms": info.taken_unix_ms,
        "entries": info.entries,
        "sha256": info.sha256,
    })
}

fn info_of(v: &Value) -> Option<BackupInfo> {
    let u64_of = |k: &str| v.get(k).and_then(Value::as_u64);
    let str_of = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    Some(BackupInfo {
        format: FORMAT_VERSION,
        run_id: str_of("run_id")?,
        n: u8::try_from(u64_of("n")?).ok()?,
        jobs: u64_of("jobs")?,
        jobs_done: u64_of("jobs_done")?,
        taken_unix_ms: u64_of("taken_unix_ms")?,
        entries: u64_of("entries")?,
        sha256: str_of("sha256")?,
    })
}

/// Asks the coordinator serving `dir` to write a backup to `to` (absolute).
/// `Ok(None)` when no coordinator answers on `dir`'s socket (none serves,
/// or one was killed and left its socket file behind). Blocking.
///
/// # Errors
///
/// [`Error::Io`] when the exchange breaks; [`Error::BackupRefused`] with
/// the coordinator's message when it could not take the backup.
pub(crate) fn request(dir: &Path, to: &Path) -> Result<Option<BackupInfo>> {
    let socket = dir.join(SOCKET);
    let mut stream = match std::os::unix::net::UnixStream::connect(&socket) {
        Ok(stream) => stream,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(source) => {
            return Err(Error::Io {
                context: format!("cannot connect to {}", socket.display()),
                source,
            });
        }
    };
    let io = |source| Error::Io {
        context: format!("the backup request on {} failed", socket.display()),
        source,
    };
    let request = json!({ "backup_to": to.to_string_lossy() });
    stream
        .write_all(format!("{request}\n").as_bytes())
        .map_err(io)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(io)?;
    let reply: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    if let Some(info) = reply.get("ok").and_then(info_of) {
        return Ok(Some(info));
    }
    let message = reply.get("error").and_then(Value::as_str).map_or_else(
        || format!("an answer that does not read: {line:?}"),
        str::to_owned,
    );
    Err(Error::BackupRefused { socket, message })
}
