//! The `nq-coord` binary: parses the command line, sets up logging and the
//! progress display, builds the [`Config`] and calls [`nq_coord::run`], or
//! runs a subcommand. Nothing else happens here.
//!
//! * `args`: the clap structs, and `Args` → [`Config`].
//! * `config_file`: `--config FILE` below the flags and the environment,
//!   and `--print-config`.
//! * `commands`: the subcommands (`status`, `health`, `audit`, `export`,
//!   `backup`, `restore`).
//! * `display`: the progress bar, and log lines drawn above it.

mod args;
mod commands;
mod config_file;
mod display;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use nq_coord::report::RunStatus;
use nq_coord::{Config, Listeners};
use nq_process::output::{stderr_line, stdout_line};

use crate::args::{BadCommandLine, Command, RunArgs};
use crate::config_file::{BadConfigFile, ConfigFile, Refused};

fn main() -> ExitCode {
    // Before any other thread starts, so that the arena cap holds for all.
    nq_process::alloc::tune();
    let parsed = match config_file::parse_from(std::env::args_os()) {
        Ok(parsed) => parsed,
        Err(Refused::Clap(e)) => e.exit(),
        Err(Refused::File(e)) => {
            nq_process::logging::fatal("nq-coord", &e);
            return ExitCode::from(2);
        }
    };
    if parsed.args.run.print_config && parsed.args.command.is_none() {
        return match stdout_line(parsed.print_config().trim_end()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                nq_process::logging::fatal("nq-coord", format_args!("{e:#}"));
                ExitCode::FAILURE
            }
        };
    }
    let config_file::Parsed { args, file, .. } = parsed;
    let bar = display::bar_for(args.command.as_ref(), args.run.progress);
    // Logs go to stderr, through the progress bar when there is one (so lines
    // do not tear it).
    nq_process::logging::init_with_writer(args.log, display::BarWriter(bar.clone()));
    let result = match args.command {
        Some(Command::Export(e)) => commands::export_solutions(e).map(|()| 0),
        Some(Command::Health(h)) => commands::health(h).map(|()| 0),
        Some(Command::Audit(a)) => commands::audit(a).map(|()| 0),
        Some(Command::Status(a)) => commands::status(a).map(|()| 0),
        Some(Command::Backup(a)) => commands::backup(a).map(|()| 0),
        Some(Command::Restore(a)) => commands::restore(a).map(|()| 0),
        None => run_coordinator(args.run, file.as_ref(), bar),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            nq_process::logging::fatal("nq-coord", format_args!("{e:#}"));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The exit status of a failure, as docs/operations.md's table gives it.
fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<BadCommandLine>().is_some()
        || e.downcast_ref::<BadConfigFile>().is_some()
    {
        return 2;
    }
    match e.downcast_ref::<nq_coord::Error>() {
        // Interrupted like a run stopped midway: resume to finish.
        Some(nq_coord::Error::CreationInterrupted) => RunStatus::Interrupted.exit_code(),
        // Options the run refuses: a retry would only repeat the refusal.
        Some(nq_coord::Error::SettingsDiffer { .. }) => 2,
        _ => 1,
    }
}

/// Runs the coordinator; returns the exit code of the run's status
/// (`RunStatus::exit_code`: 0 only for a complete run that matches the
/// published count where one is known).
fn run_coordinator(
    mut args: RunArgs,
    file: Option<&ConfigFile>,
    bar: Option<ProgressBar>,
) -> anyhow::Result<u8> {
    // A refused value the config file gave is named with its line.
    let locate = |e: anyhow::Error| match file {
        Some(file) => file.locate(e),
        None => e,
    };
    if let Some(path) = &args.config {
        tracing::info!(config = %path.display(), "options read from the config file below the flags and NQ_* variables");
    }
    args.n_from_store().map_err(locate)?;
    let listen = args.listen.clone();
    let security = std::mem::take(&mut args.security);
    let store_key = std::mem::take(&mut args.store_key);
    let metrics = args.metrics.clone();
    let mut config = Config::try_from(args).map_err(|e| locate(e.into()))?;
    security.apply(&mut config).map_err(locate)?;
    config.store_key = store_key.load(&config.data_dir).map_err(locate)?;
    let addr =
        resolve(&listen, "--listen", "0.0.0.0:50051 or 127.0.0.1:0").map_err(locate)?;
    let metrics = metrics
        .map(|m| resolve(&m, "--metrics", "127.0.0.1:9464 or 0.0.0.0:0"))
        .transpose()
        .map_err(locate)?;
    let runtime =
        tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let shutdown =
            nq_process::shutdown_signal().context("cannot install signal handlers")?;
        let display = bar.map(|bar| {
            let (progress, task) = display::start(bar);
            config.progress = Some(progress);
            task
        });
        // Bound only for a run to serve: a finished one reprints its result
        // and takes no port.
        let bind = bind(addr, metrics);
        let report = nq_coord::run_binding(config, bind, announce, shutdown).await?;
        if let Some(display) = display {
            let _ = display.await;
        }
        stdout_line(report.summary_line())?;
        let status = report.status();
        if status != RunStatus::Complete {
            stderr_line(format_args!(
                "nq-coord: {}: {}",
                status.as_str(),
                report.why()
            ));
        }
        Ok(status.exit_code())
    })
}

/// Binds `--listen` (and `--metrics`).
async fn bind(
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
) -> nq_coord::Result<Listeners> {
    let failed =
        |addr, flag| move |source| nq_coord::Error::Listen { addr, flag, source };
    let grpc = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(failed(addr, "--listen"))?;
    let http = match metrics {
        Some(at) => {
            Some(std::net::TcpListener::bind(at).map_err(failed(at, "--metrics"))?)
        }
        None => None,
    };
    Ok(Listeners { grpc, http })
}

/// Prints where the run serves, once its data directory is accepted, in
/// the lines that tests and scripts wait for: `listening on ADDR`, then
/// `metrics on ADDR`.
fn announce(listeners: &Listeners) -> std::io::Result<()> {
    stdout_line(format_args!(
        "listening on {}",
        listeners.grpc.local_addr()?
    ))?;
    if let Some(http) = &listeners.http {
        stdout_line(format_args!("metrics on {}", http.local_addr()?))?;
    }
    Ok(())
}

/// Parses `HOST:PORT` for `flag`, resolving a host name.
fn resolve(addr: &str, flag: &str, examples: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(parsed) = addr.parse() {
        return Ok(parsed);
    }
    match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(resolved)) => Ok(resolved),
        _ => bail!(
            "invalid {flag} address {addr:?}: expected HOST:PORT, such as {examples}"
        ),
    }
}
