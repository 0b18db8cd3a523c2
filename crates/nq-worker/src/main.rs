//! `nq-worker`: joins an nq coordinator and counts on every core.
//!
//! Parses the CLI, sets up logging, builds the [`nq_worker::Config`] and calls
//! [`nq_worker::run`]. Nothing else belongs here.

use std::io::IsTerminal;
use std::num::NonZeroUsize;

use anyhow::Context;
use clap::Parser;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use nq_core::search::Kernel;
use tracing_subscriber::EnvFilter;

/// Leases N-Queens jobs from an nq coordinator and solves them on all cores.
///
/// Exits 0 when the run is complete, or after a graceful drain on SIGTERM or
/// Ctrl-C (a second signal exits at once).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The coordinator: HOST, HOST:PORT or http://HOST:PORT (port 50051 by
    /// default). The worker waits, retrying, until the coordinator is up.
    #[arg(long, value_name = "HOST[:PORT]")]
    connect: String,
    /// CPU threads for the search [default: every core].
    #[arg(long, value_name = "T")]
    threads: Option<NonZeroUsize>,
    /// The count kernel: `auto` takes the fastest this CPU has (`avx512`,
    /// then `avx2`; `neon` on aarch64); `scalar` runs the portable one, for a second run that
    /// shares no kernel code with the first.
    #[arg(long, default_value = "auto", value_parser = kernel_parser())]
    kernel: Kernel,
    /// Name shown in the coordinator's logs [default: the host name].
    #[arg(long)]
    name: Option<String>,
    /// After SIGTERM or Ctrl-C, how long to keep computing the current jobs
    /// before handing them back (e.g. 500ms, 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    grace: String,
}

impl TryFrom<Args> for nq_worker::Config {
    type Error = nq_worker::Error;

    fn try_from(args: Args) -> Result<Self, Self::Error> {
        let mut config = nq_worker::Config::new(args.connect.parse()?);
        if let Some(threads) = args.threads {
            config = config.with_threads(threads);
        }
        config.kernel = args.kernel;
        config.name = args.name.unwrap_or_else(host_name);
        config.grace = nq_worker::parse_duration(&args.grace)?;
        Ok(config)
    }
}

/// Kernel names, refusing at parse time a kernel this CPU cannot run.
fn kernel_parser() -> impl TypedValueParser<Value = Kernel> {
    PossibleValuesParser::new(Kernel::ALL.map(Kernel::name)).try_map(|name| {
        let kernel: Kernel = name.parse()?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(kernel.require()?)
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "nq-worker".to_owned())
}

/// Resolves on the first SIGTERM or Ctrl-C, and arms the second one to end
/// the process at once.
///
/// # Errors
///
/// When the signal handlers cannot be installed.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    // Both signal streams exist before the first signal, so a second signal
    // arriving right after the first is never missed.
    let mut signals = Signals::new()?;
    Ok(async move {
        signals.recv().await;
        tokio::spawn(async move {
            signals.recv().await;
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        });
    })
}

/// SIGTERM (what Docker, Kubernetes and Slurm send) and SIGINT (Ctrl-C).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match try_main(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nq-worker: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn try_main(args: Args) -> anyhow::Result<()> {
    let config = nq_worker::Config::try_from(args).context("invalid arguments")?;
    let shutdown = shutdown_signal().context("cannot install signal handlers")?;
    let summary = nq_worker::run(config, shutdown)
        .await
        .context("worker failed")?;
    tracing::info!(?summary, "done");
    Ok(())
}
