//! The subcommands: `health` and `status` ask a running coordinator (one
//! call each, through the shared dial flags), `audit` and `export` read a
//! data directory, `backup` and `restore` write a backup file and a data
//! directory.

use std::io::Write;

use anyhow::{Context, bail};
use nq_coord::config::parse_duration;
use nq_coord::export::{ExportOptions, export_with_key};
use nq_coord::report::REPORT_FILE;
use nq_process::DialArgs;
use nq_process::output::{is_broken_pipe, stderr_line, stdout_line};
use nq_proto::address::CoordinatorAddress;

use crate::args::{
    AuditArgs, BackupArgs, ExportArgs, HealthArgs, RestoreArgs, StatusArgs,
};

/// The endpoint and token interceptor for `--connect` and the dial flags,
/// with `timeout` on connecting and on the call.
fn endpoint(
    connect: &str,
    timeout: &str,
    dial: &DialArgs,
) -> anyhow::Result<(tonic::transport::Endpoint, nq_proto::auth::Bearer)> {
    let timeout = parse_duration(timeout)?;
    let address: CoordinatorAddress = connect.parse().context("invalid --connect")?;
    let dial = dial.dial(address)?;
    Ok((dial.endpoint(timeout)?, dial.bearer()))
}

/// A runtime for one call.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `nq-coord health`: one `grpc.health.v1` check; an error unless SERVING.
pub(crate) fn health(args: HealthArgs) -> anyhow::Result<()> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let (endpoint, bearer) = endpoint(&args.connect, &args.timeout, &args.dial)?;
    runtime()?.block_on(async {
        let channel = endpoint.connect().await.map_err(|e| {
            anyhow::anyhow!(
                "no coordinator answers at {} ({}): is it running, and on this \
                 address and port (--connect HOST:PORT)?",
                args.connect,
                connect_failure(&e)
            )
        })?;
        let request = HealthCheckRequest {
            service: nq_proto::pb::coordinator_server::SERVICE_NAME.to_owned(),
        };
        let status = HealthClient::with_interceptor(channel, bearer)
            .check(request)
            .await
            .with_context(|| format!("the health check of {} failed", args.connect))?
            .into_inner()
            .status();
        match status {
            ServingStatus::Serving => {
                stdout_line("SERVING")?;
                Ok(())
            }
            // Before the run is loaded, and while it drains.
            other => bail!(
                "the coordinator at {} is not serving workers: {}",
                args.connect,
                other.as_str_name()
            ),
        }
    })
}

/// `nq-coord status`: one `Status` call, printed as text or JSON.
pub(crate) fn status(args: StatusArgs) -> anyhow::Result<()> {
    use nq_proto::pb::coordinator_client::CoordinatorClient;

    let (endpoint, bearer) = endpoint(&args.connect, &args.timeout, &args.dial)?;
    // One runtime: the channel's tasks live on the one that connected it.
    let runtime = runtime()?;
    let channel = match runtime.block_on(endpoint.connect()) {
        Ok(channel) => channel,
        Err(e) => return not_running(&args, &e),
    };
    let answer = runtime.block_on(async {
        let answer = CoordinatorClient::with_interceptor(channel, bearer)
            .status(nq_proto::pb::StatusRequest {})
            .await
            .map_err(|s| match s.code() {
                tonic::Code::Unimplemented => anyhow::anyhow!(
                    "the coordinator at {} is too old to answer status requests",
                    args.connect
                ),
                _ => anyhow::anyhow!("status request to {} failed: {s}", args.connect),
            })?;
        anyhow::Ok(answer.into_inner())
    })?;
    let snapshot = nq_coord::status::Snapshot::try_from(answer).with_context(|| {
        format!(
            "the coordinator at {} sent a malformed status",
            args.connect
        )
    })?;
    let text = if args.json {
        format!("{}\n", snapshot.to_json())
    } else {
        snapshot.to_text()
    };
    write_stdout(&text)
}

/// Why a connection failed, in the OS's words where it gave some
/// (`connection refused`), without the transport's repeated wrappers.
fn connect_failure(e: &tonic::transport::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    loop {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return io.kind().to_string();
        }
        match cause.source() {
            Some(next) => cause = next,
            None => return cause.to_string(),
        }
    }
}

/// `nq-coord status` when no coordinator answers: a run that is over
/// leaves its result in `DATA/report.json`, which is shown instead (the
/// summary, or the file itself with `--json`); otherwise an error that
/// says where to look.
fn not_running(args: &StatusArgs, e: &tonic::transport::Error) -> anyhow::Result<()> {
    let nobody = format!(
        "no coordinator answers at {} ({})",
        args.connect,
        connect_failure(e)
    );
    let Some(data) = &args.data else {
        bail!(
            "{nobody}: it is not running, or listens elsewhere (--connect \
             HOST:PORT); a run that is over leaves its result in its data \
             directory's {REPORT_FILE} (pass --data DIR to show it)"
        );
    };
    let path = data.join(REPORT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{nobody}, and the run in {} is not finished (it has no {REPORT_FILE}): \
             the coordinator is not running, or listens elsewhere (--connect \
             HOST:PORT); run `nq-coord --data {}` to resume the run",
            data.display(),
            data.display()
        ),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("{nobody}; cannot read {}", path.display()));
        }
    };
    if args.json {
        return write_stdout(&format!("{}\n", text.trim_end()));
    }
    let report: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{nobody}; {} is not valid JSON", path.display()))?;
    let field = |key: &str| {
        report.get(key).map_or_else(
            || "?".to_owned(),
            |v| v.as_str().map_or_else(|| v.to_string(), str::to_owned),
        )
    };
    write_stdout(&format!(
        "the run is over: the coordinator is not running ({nobody})\n\
         result    n={} status={} total={} unique={} jobs={}\n\
         why       {}\n\
         report    {}\n",
        field("n"),
        field("status"),
        field("total"),
        field("unique"),
        field("jobs"),
        field("why"),
        path.display()
    ))
}

/// Writes `text` to stdout; a closed pipe (`| head`) is a normal way to
/// read it.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}

/// `nq-coord audit`: the CSV, then the re-added totals against the stored
/// and the published ones.
pub(crate) fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let key = args.store_key.load(&args.data)?;
    // A bad share is a bad command line (exit 2), as for the run's --verify.
    let verify = nq_coord::config::parse_verify(&args.verify)
        .map_err(crate::args::BadCommandLine::from)?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let audited =
        nq_coord::audit::audit_with_key(&args.data, key.as_ref(), &mut out, verify);
    // A closed pipe (`| head`) is a normal way for a reader to stop.
    let report = match audited {
        Err(nq_coord::Error::Io { source, .. }) if is_broken_pipe(&source) => {
            return Ok(());
        }
        r => r?,
    };
    match out.flush() {
        Err(e) if is_broken_pipe(&e) => return Ok(()),
        r => r.context("cannot write the audit")?,
    }
    drop(out);
    let stored = |v: Option<u128>| {
        v.map_or("none (the run is not finished)".into(), |v| v.to_string())
    };
    let published = match report.published {
        Some((q, u)) => format!("published {q} and {u}"),
        None => "no published value for this N".into(),
    };
    stderr_line(format_args!(
        "nq-coord audit: {} of {} jobs settled; re-added total {} (stored {}), unique {} (stored {}); {published}; digest {}",
        report.settled,
        report.jobs,
        report.total,
        stored(report.stored_total),
        report.unique.map_or("-".into(), |u| u.to_string()),
        stored(report.stored_unique),
        report.digest,
    ));
    let differences = report.differences();
    for difference in &differences {
        stderr_line(format_args!("nq-coord audit: MISMATCH: {difference}"));
    }
    if !differences.is_empty() {
        bail!(
            "{} total(s) differ ({}): the data directory was damaged or edited, \
             or written by a faulty coordinator; do not trust its result",
            differences.len(),
            differences
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(())
}

/// `nq-coord export`: the stored solutions, in the chosen notation.
pub(crate) fn export_solutions(args: ExportArgs) -> anyhow::Result<()> {
    let format = args.format.parse()?;
    let key = args.store_key.load(&args.data)?;
    let options = ExportOptions {
        unique: args.unique,
        format,
    };
    let result = match &args.output {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            export_with_key(
                &args.data,
                key.as_ref(),
                &options,
                &mut std::io::BufWriter::new(file),
            )
        }
        None => {
            let stdout = std::io::stdout();
            export_with_key(
                &args.data,
                key.as_ref(),
                &options,
                &mut std::io::BufWriter::new(stdout.lock()),
            )
        }
    };
    let summary = match result {
        // A closed pipe (`| head`) is a normal way for a listing to end.
        Err(nq_coord::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            return Ok(());
        }
        r => r?,
    };
    if !summary.complete {
        stderr_line(format_args!(
            "nq-coord: warning: the run in {} is not finished ({} of {} jobs done); \
             exported the solutions of finished jobs only",
            args.data.display(),
            summary.jobs_done,
            summary.jobs
        ));
    }
    Ok(())
}

/// `nq-coord backup`: a sealed backup of a serving or stopped run.
pub(crate) fn backup(args: BackupArgs) -> anyhow::Result<()> {
    use nq_coord::backup::Taken;
    let key = args.store_key.load(&args.data)?;
    let (info, taken) = nq_coord::backup::take(&args.data, &args.to, key)?;
    let by = match taken {
        Taken::ByServingRun => "serving-run",
        Taken::FromStoppedRun => "stopped-run",
    };
    stdout_line(format_args!(
        "backup written: path={} run={} n={} jobs={} done={} by={by} sha256={}",
        args.to.display(),
        info.run_id,
        info.n,
        info.jobs,
        info.jobs_done,
        info.sha256
    ))?;
    Ok(())
}

/// `nq-coord restore`: a data directory rebuilt from a checked backup.
pub(crate) fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let key = args.store_key.load(&args.data)?;
    let info = nq_coord::backup::restore(&args.from, &args.data, args.force, key)?;
    stdout_line(format_args!(
        "restored: data={} run={} n={} jobs={} done={} sha256={}",
        args.data.display(),
        info.run_id,
        info.n,
        info.jobs,
        info.jobs_done,
        info.sha256
    ))?;
    stderr_line(format_args!(
        "nq-coord: resume with: nq-coord --n {} --data {} (the jobs finished after the backup are computed again)",
        info.n,
        args.data.display()
    ));
    Ok(())
}
