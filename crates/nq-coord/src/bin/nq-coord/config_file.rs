//! `--config FILE`: the run's options in a TOML file, and `--print-config`.
//!
//! A config file takes every option of a run (not of a subcommand) under
//! its long flag name, in kebab-case, at the top level: `n = 18`,
//! `local-threads = 0`, `lease-ttl = "30s"`, `verify = 0.05`,
//! `trust = ["token:lab"]`, `solutions = true`. Options of a number take a
//! TOML integer; switches `true` or `false`; `trust` an array of strings;
//! the others a string (or a number where their form is one, as for
//! `verify` and durations).
//!
//! Precedence: a flag on the command line, then its `NQ_*` variable, then
//! the file, then the default. The file's values are checked key by key
//! (an unknown key, a wrong type or a bad value is refused with the file,
//! the line, the key and the accepted form), then given to clap as flags
//! for the options that neither the command line nor the environment set
//! (`ArgMatches::value_source`), so that one parser checks every layer.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};
use nq_coord::config::GivenSettings;
use toml::de::{DeTable, DeValue};

use crate::args::Args;

/// Options of the run that are no settings of it: they say what to do
/// with the file itself.
const NOT_IN_FILE: &[&str] = &["config", "print_config", "help", "version"];

/// A config file that cannot be used, with the file, the line and the key
/// at fault: `nq-coord` exits 2 for it, as for a bad flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadConfigFile(String);

/// What the command line, the environment and the config file say.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The options, every layer applied.
    pub(crate) args: Args,
    /// The values the config file gave (those no higher layer overrode).
    pub(crate) file: Option<ConfigFile>,
    /// Where each option's value came from, for `--print-config`.
    matches: ArgMatches,
}

/// Why the command line was not parsed.
#[derive(Debug)]
pub(crate) enum Refused {
    /// clap's own error (usage, `--help`, `--version` included).
    Clap(clap::Error),
    /// The config file's.
    File(BadConfigFile),
}

impl From<clap::Error> for Refused {
    fn from(e: clap::Error) -> Refused {
        Refused::Clap(e)
    }
}

impl From<BadConfigFile> for Refused {
    fn from(e: BadConfigFile) -> Refused {
        Refused::File(e)
    }
}

/// Parses `argv` (program name first) with the config file it names, if
/// any, layered below the command line and the environment.
pub(crate) fn parse_from<I, T>(argv: I) -> Result<Parsed, Refused>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let command = Args::command();
    let first = command.clone().try_get_matches_from(&argv)?;
    // A subcommand takes its own flags: a file (or NQ_CONFIG) is the run's.
    let mut file = match first.get_one::<PathBuf>("config") {
        Some(path) if first.subcommand().is_none() => {
            Some(ConfigFile::read(path, &command)?)
        }
        _ => None,
    };
    let matches = match &mut file {
        Some(file) => {
            argv.extend(file.flags_below(&first, &command));
            command.try_get_matches_from(&argv)?
        }
        None => first,
    };
    let mut args = Args::from_arg_matches(&matches)?;
    args.run.given = GivenSettings {
        verify: is_given(&matches, "verify"),
        trust: is_given(&matches, "trust"),
        ban_after: is_given(&matches, "ban_after"),
        gpu_sample: is_given(&matches, "gpu_sample"),
    };
    Ok(Parsed {
        args,
        file,
        matches,
    })
}

/// Whether option `id` was set on the command line, in the environment or
/// in the config file (whose values reach clap as flags), not defaulted.
fn is_given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The options of a run that a config file may set.
fn file_options(command: &Command) -> impl Iterator<Item = &Arg> {
    command
        .get_arguments()
        .filter(|a| !NOT_IN_FILE.contains(&a.get_id().as_str()) && a.get_long().is_some())
}

/// The key of an option in a config file: its long flag name.
fn key_of(arg: &Arg) -> &str {
    arg.get_long()
        .expect("file_options keeps options with a long name")
}

/// A config file, read and checked.
#[derive(Debug)]
pub(crate) struct ConfigFile {
    path: PathBuf,
    /// The values by option id, each as the flag's arguments, with its
    /// key and line.
    values: BTreeMap<String, FileValue>,
}

/// One key of a config file.
#[derive(Debug)]
struct FileValue {
    key: String,
    line: usize,
    /// The flag's arguments: none for a switch that is off, one for a
    /// switch that is on or a single value, several for a list.
    flags: Vec<OsString>,
}

impl ConfigFile {
    /// Reads the file at `path` and checks every key, type and value
    /// against the options of `command`.
    fn read(path: &Path, command: &Command) -> Result<ConfigFile, BadConfigFile> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BadConfigFile(format!(
                "cannot read the config file {} (--config or NQ_CONFIG): {e}",
                path.display()
            ))
        })?;
        let table = DeTable::parse(&text).map_err(|e| {
            BadConfigFile(format!(
                "the config file {} is not valid TOML: {}",
                path.display(),
                e.to_string().trim_end()
            ))
        })?;
        let mut values = BTreeMap::new();
        for (key, value) in table.get_ref().iter() {
            let line = line_of(&text, key.span().start);
            let at = |problem: String| {
                BadConfigFile(format!("{}:{line}: {problem}", path.display()))
            };
            let arg = file_options(command)
                .find(|a| key_of(a) == key.get_ref().as_ref())
                .ok_or_else(|| at(unknown_key(key.get_ref(), command)))?;
            let flags = flags_of(arg, value.get_ref()).map_err(at)?;
            values.insert(
                arg.get_id().to_string(),
                FileValue {
                    key: key_of(arg).to_owned(),
                    line,
                    flags,
                },
            );
        }
        Ok(ConfigFile {
            path: path.to_owned(),
            values,
        })
    }

    /// The flags that give the file's values to the options that neither
    /// the command line nor the environment set in `first`, nor any option
    /// they conflict with. The values overridden so are dropped: what is
    /// left is what the file decides.
    fn flags_below(&mut self, first: &ArgMatches, command: &Command) -> Vec<OsString> {
        let set_above = |id: &str| is_given(first, id);
        let mut flags = Vec::new();
        for arg in file_options(command) {
            let id = arg.get_id().as_str();
            if !self.values.contains_key(id) {
                continue;
            }
            if set_above(id)
                || command
                    .get_arg_conflicts_with(arg)
                    .iter()
                    .any(|other| set_above(other.get_id().as_str()))
            {
                self.values.remove(id);
                continue;
            }
            let value = &self.values[id];
            for v in &value.flags {
                let mut flag = OsString::from(format!("--{}", value.key));
                if !matches!(arg.get_action(), ArgAction::SetTrue) {
                    flag.push("=");
                    flag.push(v);
                }
                flags.push(flag);
            }
        }
        flags
    }

    /// `error` with the file and line of the key it is about, when it is
    /// about a value this file gave: its message starts `invalid --KEY`
    /// (the flag checks of the library and of `nq-coord`), or it refuses
    /// a duration this file gave.
    pub(crate) fn locate(&self, error: anyhow::Error) -> anyhow::Error {
        let message = error.to_string();
        let inner = error.downcast_ref::<nq_coord::Error>().or_else(|| {
            error
                .downcast_ref::<crate::args::BadCommandLine>()
                .map(|b| &b.0)
        });
        // The two refusals that do not name their flag.
        let duration = match inner {
            Some(nq_coord::Error::Duration { input }) => Some(input.as_str()),
            _ => None,
        };
        let split = matches!(
            inner,
            Some(nq_coord::Error::SplitSyntax { .. } | nq_coord::Error::Split { .. })
        );
        let found = self.values.values().find(|v| {
            let flag = format!("--{}", v.key);
            message.starts_with(&format!("invalid {flag}"))
                || (split && v.key == "split")
                || duration.is_some_and(|input| v.flags.iter().any(|f| f == input))
        });
        match found {
            Some(v) => error.context(format!(
                "{}:{}: the value of `{}`",
                self.path.display(),
                v.line,
                v.key
            )),
            None => error,
        }
    }
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The message for a key that is no option of a run.
fn unknown_key(key: &str, command: &Command) -> String {
    let keys: Vec<&str> = file_options(command).map(key_of).collect();
    format!(
        "unknown key `{key}`: a config file takes the options of a run under their \
         long flag names, at the top level, such as `local-threads = 0`; the keys \
         are: {}",
        keys.join(", ")
    )
}

/// What an option takes in a config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A switch: `true` or `false`.
    Switch,
    /// A list of strings (`--trust`, repeatable).
    List,
    /// A number of the flag's type.
    Integer,
    /// A string; a number is taken as its text.
    Text,
}

impl Kind {
    fn of(arg: &Arg) -> Kind {
        use std::any::TypeId;
        match arg.get_action() {
            ArgAction::SetTrue => Kind::Switch,
            ArgAction::Append => Kind::List,
            _ => {
                let id = arg.get_value_parser().type_id();
                let integers = [
                    TypeId::of::<u64>(),
                    TypeId::of::<u32>(),
                    TypeId::of::<usize>(),
                ];
                if integers.iter().any(|t| id == *t) {
                    Kind::Integer
                } else {
                    Kind::Text
                }
            }
        }
    }

    /// The accepted form, with an example for `arg`.
    fn accepted(self, arg: &Arg) -> String {
        let key = key_of(arg);
        let name = arg
            .get_value_names()
            .and_then(|n| n.first())
            .map_or_else(|| "VALUE".to_owned(), ToString::to_string);
        let default = arg
            .get_default_values()
            .first()
            .and_then(|d| d.to_str())
            .map(str::to_owned);
        match self {
            Kind::Switch => format!("`true` or `false`, such as `{key} = true`"),
            Kind::List => {
                format!(
                    "an array of strings, as for --{key} {name}, such as `{key} = [\"…\"]`"
                )
            }
            Kind::Integer => match default {
                Some(d) => {
                    format!("an integer, as for --{key} {name}, such as `{key} = {d}`")
                }
                None => format!("an integer, as for --{key} {name}"),
            },
            Kind::Text => match default {
                Some(d) => format!(
                    "a string, as for --{key} {name}, such as `{key} = {}`",
                    toml::Value::String(d)
                ),
                None => format!("a string, as for --{key} {name}"),
            },
        }
    }
}

/// The flag arguments of `value` for `arg`, checked by the flag's own
/// parser; or why it is refused, with the accepted form.
fn flags_of(arg: &Arg, value: &DeValue<'_>) -> Result<Vec<OsString>, String> {
    let kind = Kind::of(arg);
    let key = key_of(arg);
    let wrong_type = |found: &DeValue<'_>| {
        let found = found.type_str();
        let article = if found.starts_with(['a', 'i']) {
            "an"
        } else {
            "a"
        };
        format!(
            "`{key}` takes {}; found {article} {found}",
            kind.accepted(arg)
        )
    };
    let texts: Vec<String> = match (kind, value) {
        (Kind::Switch, DeValue::Boolean(on)) => {
            return Ok(if *on {
                vec![OsString::new()]
            } else {
                Vec::new()
            });
        }
        (Kind::List, DeValue::Array(items)) => items
            .iter()
            .map(|item| match item.get_ref() {
                DeValue::String(s) => Ok(s.to_string()),
                other => Err(format!("{} in the array", wrong_type(other))),
            })
            .collect::<Result<_, _>>()?,
        (Kind::Integer | Kind::Text, DeValue::Integer(i)) => {
            let n = i128::from_str_radix(i.as_str(), i.radix())
                .map_err(|_| format!("`{key}`: {i} is out of range"))?;
            vec![n.to_string()]
        }
        (Kind::Text, DeValue::Float(f)) => {
            let x: f64 = f
                .as_str()
                .parse()
                .map_err(|_| format!("`{key}`: {f} is not a number"))?;
            vec![x.to_string()]
        }
        (Kind::Text, DeValue::String(s)) => vec![s.to_string()],
        _ => return Err(wrong_type(value)),
    };
    // The flag's own parser, alone: a command of this one value, without
    // the option's environment variable or its ties to other options.
    let mut alone = Arg::new(arg.get_id().clone())
        .value_parser(arg.get_value_parser().clone())
        .allow_hyphen_values(true);
    if let Some(names) = arg.get_value_names() {
        alone = alone.value_names(names.iter().cloned());
    }
    let check = Command::new("nq-coord").no_binary_name(true).arg(alone);
    for text in &texts {
        check.clone().try_get_matches_from([text]).map_err(|e| {
            format!(
                "`{key}`: {} (the value takes {})",
                clap_message(&e),
                kind.accepted(arg)
            )
        })?;
    }
    Ok(texts.into_iter().map(OsString::from).collect())
}

/// The first line of clap's message, without its `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

impl Parsed {
    /// The effective configuration as a TOML file that `--config` takes
    /// back: every option of a run with its value from the command line,
    /// the environment or the file. A default is written as a comment (so
    /// that reading the file back gives nothing that was not given: a
    /// resume takes the run's stored verify, trust, ban-after and
    /// gpu-sample unless they are given), and so are an option with no
    /// value and a secret
    /// (the token and the store key are never printed: keep them in the
    /// environment or a key file).
    pub(crate) fn print_config(&self) -> String {
        let command = Args::command();
        let mut out = String::from(
            "# nq-coord --config FILE: the options of a run under their long flag names.\n\
             # Precedence: flag > NQ_* environment variable > this file > default.\n",
        );
        for arg in file_options(&command) {
            let id = arg.get_id().as_str();
            let key = key_of(arg);
            let raw: Vec<&OsStr> = self
                .matches
                .get_raw(id)
                .map(Iterator::collect)
                .unwrap_or_default();
            let line = match Kind::of(arg) {
                _ if raw.is_empty() => format!("# {key}: not set"),
                _ if arg.is_hide_env_values_set() => format!(
                    "# {key}: set, not printed (a secret: keep it in {})",
                    arg.get_env()
                        .and_then(OsStr::to_str)
                        .unwrap_or("the environment")
                ),
                Kind::Switch => format!("{key} = {}", self.matches.get_flag(id)),
                Kind::List => {
                    let items: Vec<String> = raw.iter().map(|v| toml_string(v)).collect();
                    format!("{key} = [{}]", items.join(", "))
                }
                Kind::Integer => format!("{key} = {}", raw[0].to_string_lossy()),
                Kind::Text => format!("{key} = {}", toml_string(raw[0])),
            };
            // A default stays a comment: written as a value, it would be
            // given, and a resume would hold the run's stored settings to it.
            if self.matches.value_source(id) == Some(ValueSource::DefaultValue) {
                let _ = writeln!(out, "# {line} (default)");
            } else {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }
}

/// `value` as a TOML string.
fn toml_string(value: &OsStr) -> String {
    toml::Value::String(value.to_string_lossy().into_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// A config file with `text`, kept alive by the returned handle.
    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn parse(argv: &[&str]) -> Result<Parsed, Refused> {
        parse_from(std::iter::once("nq-coord").chain(argv.iter().copied()))
    }

    fn refusal(argv: &[&str]) -> String {
        match parse(argv) {
            Err(Refused::File(e)) => e.to_string(),
            Err(Refused::Clap(e)) => panic!("clap refused it: {e}"),
            Ok(p) => panic!("accepted: {:?}", p.args),
        }
    }

    /// Flag over file over default. (The environment sits between flag and
    /// file through clap's own `env`; this test sets no variable, as tests
    /// run in parallel in one process.)
    #[test]
    fn a_flag_wins_over_the_file_which_wins_over_the_default() {
        let f = file(
            "n = 9\nlocal-threads = 0\nverify = 0.5\nban-after = 2\ngpu-sample = \"2%\"\n",
        );
        let path = f.path().to_str().unwrap();
        let p = parse(&["--config", path, "--verify", "1"]).unwrap();
        let config = nq_coord::Config::try_from(p.args.run).unwrap();
        assert_eq!(config.board.n(), 9);
        assert_eq!(config.local_threads, 0);
        assert_eq!(config.verify, nq_coord::quorum::Fraction::Fixed(1.0));
        assert_eq!(config.ban_after.get(), 2);
        assert_eq!(config.gpu_sample, 0.02);
        // Defaults stay where neither says anything.
        assert_eq!(config.lease_ttl, std::time::Duration::from_secs(30));
        // Given: the flag's verify, the file's ban-after and gpu-sample; not
        // trust.
        assert_eq!(
            config.given,
            GivenSettings {
                verify: true,
                trust: false,
                ban_after: true,
                gpu_sample: true,
            }
        );
        // A flag gives it too, and wins over the file.
        let p = parse(&["--config", path, "--gpu-sample", "0.1"]).unwrap();
        let config = nq_coord::Config::try_from(p.args.run).unwrap();
        assert_eq!(config.gpu_sample, 0.1);
        assert!(config.given.gpu_sample);
        let bare = parse(&["--n", "9"]).unwrap();
        assert_eq!(bare.args.run.given, GivenSettings::default());
        let config = nq_coord::Config::try_from(bare.args.run).unwrap();
        assert_eq!(config.gpu_sample, nq_coord::quorum::DEFAULT_GPU_SAMPLE);
    }

    /// A file value of an option that conflicts with a flag given above it
    /// is left out, as the flag wins.
    #[test]
    fn a_flag_wins_over_a_conflicting_file_option() {
        let f = file("store-key-file = \"/nonexistent/key\"\n");
        let path = f.path().to_str().unwrap();
        let hex = "ab".repeat(32);
        let p = parse(&["--config", path, "--n", "8", "--store-key", &hex]).unwrap();
        assert_eq!(p.args.run.store_key.store_key_file, None);
    }

    #[test]
    fn bad_files_are_refused_with_file_line_key_and_form() {
        let f = file("n = 8\n\nlocal-thread = 0\n");
        let path = f.path().to_str().unwrap();
        let err = refusal(&["--config", path]);
        assert!(
            err.starts_with(&format!("{path}:3: unknown key `local-thread`"))
                && err.contains("local-threads"),
            "{err}"
        );
        let f = file("n = \"eight\"\n");
        let err = refusal(&["--config", f.path().to_str().unwrap()]);
        assert!(
            err.contains(":1: `n` takes an integer") && err.contains("found a string"),
            "{err}"
        );
        let f = file("solutions = \"yes\"\n");
        let err = refusal(&["--config", f.path().to_str().unwrap()]);
        assert!(err.contains("`true` or `false`"), "{err}");
        let f = file("trust = \"token:a\"\n");
        let err = refusal(&["--config", f.path().to_str().unwrap()]);
        assert!(err.contains("an array of strings"), "{err}");
        let f = file("n = 8\nlocal-threads = 100000\n");
        let err = refusal(&["--config", f.path().to_str().unwrap()]);
        assert!(
            err.contains(":2: `local-threads`") && err.contains("0..=4096"),
            "{err}"
        );
        let f = file("progress = \"sometimes\"\n");
        let err = refusal(&["--config", f.path().to_str().unwrap()]);
        assert!(err.contains("`progress`") && err.contains("auto"), "{err}");
        let f = file("n = 8\nverify = [\n");
        let err = refusal(&["--config", f.path().to_str().unwrap()]);
        assert!(
            err.contains("not valid TOML") && err.contains("line"),
            "{err}"
        );
        let err = refusal(&["--config", "/nonexistent/nq.toml"]);
        assert!(
            err.contains("cannot read the config file /nonexistent/nq.toml"),
            "{err}"
        );
    }

    /// A value that only the library refuses is located in the file.
    #[test]
    fn library_refusals_name_the_file_and_line() {
        let f = file("n = 8\nlease-ttl = \"0s\"\nverify = 2\n");
        let path = f.path().to_str().unwrap();
        let p = parse(&["--config", path, "--lease-ttl", "5s"]).unwrap();
        let file = p.file.unwrap();
        let err = nq_coord::Config::try_from(p.args.run)
            .map_err(|e| file.locate(e.into()))
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.starts_with(&format!(
                "{path}:3: the value of `verify`: invalid --verify"
            )),
            "{text}"
        );
        let p = parse(&["--config", path, "--verify", "1"]).unwrap();
        let file = p.file.unwrap();
        let err = nq_coord::Config::try_from(p.args.run)
            .map_err(|e| file.locate(e.into()))
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.starts_with(&format!("{path}:2: the value of `lease-ttl`")),
            "{text}"
        );
        // A value the flag gave is not blamed on the file's line.
        let p = parse(&["--config", path, "--lease-ttl", "5s", "--verify", "3"]).unwrap();
        let file = p.file.unwrap();
        let err = nq_coord::Config::try_from(p.args.run)
            .map_err(|e| file.locate(e.into()))
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(text.starts_with("invalid --verify: 3"), "{text}");
    }

    /// `--print-config` prints what `--config` takes back, to the same
    /// configuration.
    #[test]
    fn the_printed_configuration_reads_back_the_same() {
        let f = file(
            "n = 10\nlocal-threads = 1\nverify = \"5%\"\ntrust = [\"token:lab\", \"token:b\"]\nsolutions = true\nlease-ttl = \"2s\"\n",
        );
        let first =
            parse(&["--config", f.path().to_str().unwrap(), "--jobs", "64"]).unwrap();
        let printed = first.print_config();
        assert!(printed.contains("jobs = 64\n"), "{printed}");
        assert!(
            printed.contains("trust = [\"token:lab\", \"token:b\"]\n"),
            "{printed}"
        );
        assert!(printed.contains("# linger: not set\n"), "{printed}");
        assert!(printed.contains("# ban-after = 3 (default)\n"), "{printed}");
        assert!(printed.contains("solutions = true\n"), "{printed}");
        let again = file(&printed);
        let second = parse(&["--config", again.path().to_str().unwrap()]).unwrap();
        assert_eq!(second.print_config(), printed);
        let (a, b) = (
            nq_coord::Config::try_from(first.args.run).unwrap(),
            nq_coord::Config::try_from(second.args.run).unwrap(),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
