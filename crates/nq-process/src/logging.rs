//! Logging set-up: one place where a binary turns on `tracing`.
//!
//! Logs go to stderr (stdout carries results). `RUST_LOG` picks what is
//! logged (an `EnvFilter`, `info` by default), `--log-format` how: `text`
//! for people, with colours only when stderr is a terminal and `NO_COLOR` is
//! unset, or `json`, one object per line for log collectors:
//!
//! ```text
//! {"timestamp":"…","level":"INFO","message":"registered","worker":"w-1",…,"target":"nq_worker::lease"}
//! ```
//!
//! The event's fields sit at the top level beside `message`; the spans it is
//! in are under `spans`.

use std::fmt::Display;
use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::output::{StderrWriter, stderr_line};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event, for log collectors.
    Json,
}

/// The logging flags every nq binary takes; `#[command(flatten)]` them into
/// the binary's arguments.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct LogArgs {
    /// Log format on stderr: `text` for people, `json` (one object per line)
    /// for log collectors. `RUST_LOG` picks what is logged (default `info`).
    #[arg(long, value_enum, env = "NQ_LOG_FORMAT", default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// The format chosen by [`init`], for [`fatal`].
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Installs the global `tracing` subscriber: the `RUST_LOG` filter (`info`
/// when unset or invalid), the chosen format, and [`StderrWriter`], which
/// never panics on a closed stderr.
///
/// Call it once, at the start of `main`.
///
/// # Panics
///
/// When a global subscriber is already installed.
pub fn init(args: LogArgs) {
    init_with_writer(args, StderrWriter);
}

/// [`init`] with another writer, e.g. one that draws log lines above a
/// progress bar. The writer must not fail on a closed stderr: it should
/// swallow write errors as [`StderrWriter`] does.
///
/// # Panics
///
/// When a global subscriber is already installed.
pub fn init_with_writer<W>(args: LogArgs, writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // tracing-subscriber reports a failed write with `eprintln!`, which
        // panics when stderr is the thing that failed.
        .log_internal_errors(false);
    match args.log_format {
        LogFormat::Text => builder.with_ansi(colours()).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    let _ = FORMAT.set(args.log_format);
}

/// Colours only for a person: stderr is a terminal and `NO_COLOR` is unset
/// or empty (<https://no-color.org>).
fn colours() -> bool {
    std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The last words of a program that failed: `PROGRAM: error: ERROR` on
/// stderr with the error's causes (format an `anyhow::Error` with `{:#}`
/// before passing it), or with `--log-format json` an `error` event, so that
/// a log collector gets JSON to the end. Never panics, even on a closed
/// stderr.
pub fn fatal(program: &str, error: impl Display) {
    match FORMAT.get() {
        Some(LogFormat::Json) => {
            tracing::error!(program, error = %error, "{program} failed");
        }
        _ => stderr_line(format_args!("{program}: error: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn the_format_is_a_flag_with_a_text_default() {
        let cli = Cli::try_parse_from(["x", "--log-format", "json"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
        // The default, unless NQ_LOG_FORMAT says otherwise.
        if std::env::var_os("NQ_LOG_FORMAT").is_none() {
            let cli = Cli::try_parse_from(["x"]).unwrap();
            assert_eq!(cli.log.log_format, LogFormat::Text);
        }
        let err = Cli::try_parse_from(["x", "--log-format", "xml"]).unwrap_err();
        assert!(
            err.to_string().contains("[possible values: text, json]"),
            "{err}"
        );
    }
}
