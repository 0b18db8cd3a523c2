//! `nq-worker`: joins an nq coordinator and counts on every core.
//!
//! Parses the CLI, sets up logging, builds the [`nq_worker::Config`] and calls
//! [`nq_worker::run`]. Nothing else belongs here.

use std::num::NonZeroUsize;

use anyhow::Context;
use clap::Parser;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use nq_core::pool::MAX_THREADS;
use nq_core::search::Kernel;
use nq_worker::config::GpuDevices;

/// Leases N-Queens jobs from an nq coordinator and solves them on all cores.
///
/// Exits 0 when the run is complete, or after a graceful drain on SIGTERM or
/// Ctrl-C (a second signal exits at once, with status 130); exits 1 on an
/// error, such as no coordinator answering for --give-up. Every flag can also
/// be set from the environment variable shown with it.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The coordinator: HOST, HOST:PORT, http://HOST:PORT or
    /// https://HOST:PORT (port 50051 by default; https, or any form with
    /// --ca, speaks TLS). The worker waits, retrying, until the coordinator
    /// is up.
    #[arg(long, value_name = "HOST[:PORT]", env = "NQ_CONNECT")]
    connect: String,
    /// CPU threads for the search, 1 to 4096 [default: every core].
    #[arg(long, value_name = "T", env = "NQ_THREADS", value_parser = threads_parser())]
    threads: Option<NonZeroUsize>,
    /// The count kernel: `auto` takes the fastest this CPU has (`avx512`,
    /// then `avx2`; `neon` on aarch64); `scalar` runs the portable one, for a second run that
    /// shares no kernel code with the first.
    #[arg(long, default_value = "auto", env = "NQ_KERNEL", value_parser = kernel_parser())]
    kernel: Kernel,
    /// Count on NVIDIA GPUs as well: `--gpu` alone is device 0, `--gpu all`
    /// every device, `--gpu 0,2` those devices (numbered from 0). Needs the
    /// NVIDIA driver; NVRTC is used when installed, else a PTX built into the
    /// binary. The GPUs share the jobs that leave the kernel to the worker
    /// (each takes more as it finishes faster) and report them as kernel
    /// `cuda`; jobs that name a CPU kernel, and solution listings, stay on
    /// the CPU threads. Before leasing, each GPU counts N = 12 against the
    /// CPU; without a usable GPU, or on any difference, the worker exits 1
    /// with one line saying why. Needs `--kernel auto`.
    #[arg(
        long,
        value_name = "all|I[,I...]",
        env = "NQ_GPU",
        num_args = 0..=1,
        default_missing_value = "0"
    )]
    gpu: Option<GpuDevices>,
    /// Name shown in the coordinator's logs [default: the host name]. It is
    /// part of the worker's identity for verification only on the
    /// coordinator's own machine without a token (`name@127.0.0.1`);
    /// elsewhere a worker is its credential (per-machine token, client
    /// certificate) or its address, whatever its name, and on the
    /// coordinator's machine with the run's token it is the operator's own.
    #[arg(long, env = "NQ_NAME")]
    name: Option<String>,
    /// After SIGTERM or Ctrl-C, how long to keep computing the current jobs
    /// before handing them back (e.g. 500ms, 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "30s", env = "NQ_GRACE")]
    grace: String,
    /// Exit with an error after this long without an answer from the
    /// coordinator, counted from its last answer (or from the start): a worker
    /// that missed the end of a run gives its machine back. `never` (or 0)
    /// waits forever. The default outlasts a coordinator that is slow to come
    /// up or restarting.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10m",
        env = "NQ_GIVE_UP"
    )]
    give_up: String,
    #[command(flatten)]
    log: nq_process::LogArgs,
    // --token, --ca, --tls-cert, --tls-key: the flags `nq-coord status` takes too.
    #[command(flatten)]
    dial: nq_process::DialArgs,
}

impl TryFrom<Args> for nq_worker::Config {
    type Error = anyhow::Error;

    fn try_from(args: Args) -> anyhow::Result<Self> {
        let dial = args.dial.dial(args.connect.parse()?)?;
        let mut config = nq_worker::Config::new(dial.address);
        if let Some(threads) = args.threads {
            config = config.with_threads(threads);
        }
        config.kernel = args.kernel;
        if let Some(devices) = args.gpu {
            // The GPU takes the jobs that leave the kernel to the worker; with
            // a CPU kernel forced it would never get one.
            anyhow::ensure!(
                args.kernel == Kernel::Auto,
                "--gpu needs --kernel auto (the default): with --kernel {} every job would \
                 run on that CPU kernel and the GPU would stay idle",
                args.kernel
            );
            config = config.with_gpu(devices);
        }
        config.name = args.name.unwrap_or_else(host_name);
        config.grace = nq_worker::parse_duration(&args.grace)?;
        config.give_up = nq_worker::config::parse_give_up(&args.give_up)?;
        config.token = dial.token;
        config.tls = dial.tls;
        Ok(config)
    }
}

/// Thread counts from 1 to nq-core's cap, the rule `nq count` follows too.
fn threads_parser() -> impl TypedValueParser<Value = NonZeroUsize> {
    clap::value_parser!(u64)
        .range(1..=MAX_THREADS as u64)
        .map(|t| NonZeroUsize::new(t as usize).expect("the range starts at 1"))
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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    nq_process::logging::init(args.log);
    match try_main(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            nq_process::logging::fatal("nq-worker", format_args!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn try_main(args: Args) -> anyhow::Result<()> {
    let config = nq_worker::Config::try_from(args).context("invalid arguments")?;
    let shutdown =
        nq_process::shutdown_signal().context("cannot install signal handlers")?;
    let summary = nq_worker::run(config, shutdown)
        .await
        .context("worker failed")?;
    tracing::info!(?summary, "done");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every flag can be set from an `NQ_*` variable, and `--help` says which.
    #[test]
    fn every_flag_has_an_environment_variable() {
        let cmd = Args::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg.get_env().unwrap_or_else(|| panic!("--{id} has no env"));
            let want = format!("NQ_{}", id.to_uppercase());
            assert_eq!(env.to_str(), Some(want.as_str()), "--{id}");
        }
    }

    #[test]
    fn gpu_lists_parse_and_need_the_auto_kernel() {
        let config = |argv: &[&str]| {
            let mut all = vec!["w", "--connect", "h"];
            all.extend_from_slice(argv);
            nq_worker::Config::try_from(Args::try_parse_from(all).unwrap()).unwrap()
        };
        assert_eq!(config(&[]).gpu, None);
        assert_eq!(config(&["--gpu"]).gpu, Some(GpuDevices::List(vec![0])));
        assert_eq!(config(&["--gpu", "all"]).gpu, Some(GpuDevices::All));
        let two = config(&["--gpu", "0,2"]);
        assert_eq!(two.gpu, Some(GpuDevices::List(vec![0, 2])));
        assert!(two.max_jobs >= 2 * nq_worker::config::GPU_MAX_JOBS);
        for bad in ["0,0", "first", "1,-2", ""] {
            let err = Args::try_parse_from(["w", "--connect", "h", "--gpu", bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains("all") && err.contains("0,2"), "{bad}: {err}");
        }
        let forced =
            Args::try_parse_from(["w", "--connect", "h", "--gpu", "--kernel", "scalar"]);
        let err = nq_worker::Config::try_from(forced.unwrap()).unwrap_err();
        assert!(err.to_string().contains("--kernel auto"), "{err}");
    }

    #[test]
    fn thread_counts_are_capped_with_the_range_named() {
        let err = Args::try_parse_from(["w", "--connect", "h", "--threads", "100000"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("1..=4096"), "{err}");
        let ok = Args::try_parse_from(["w", "--connect", "h", "--threads", "4096"]);
        assert_eq!(ok.unwrap().threads.map(NonZeroUsize::get), Some(4096));
    }
}
