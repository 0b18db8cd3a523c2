//! Durations as both command lines write them (`--lease-ttl`, `--linger`,
//! `--grace`, …): one parser, so that the coordinator and the worker accept
//! the same forms and say the same thing about the ones they refuse.

use std::time::Duration;

/// The forms [`parse_duration`] accepts, for error messages.
pub const DURATION_FORMS: &str =
    "a number with a unit, such as 500ms, 30s, 1.5m or 1h (a bare number means seconds)";

/// A duration that [`parse_duration`] refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: expected {DURATION_FORMS}")]
pub struct DurationError {
    /// What was given.
    pub input: String,
}

/// Parses a non-negative number with an optional unit `ms`, `s`, `m`/`min` or
/// `h` (no unit means seconds); surrounding spaces are ignored. Zero is
/// accepted: callers for which zero makes no sense refuse it themselves.
///
/// ```
/// use std::time::Duration;
/// use nq_proto::duration::parse_duration;
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
/// assert!(parse_duration("soon").is_err());
/// ```
///
/// # Errors
///
/// [`DurationError`] for anything else: no number, an unknown unit, a
/// negative or non-finite value, or one too large for [`Duration`].
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError {
        input: input.to_owned(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration(" 30s "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refusals_name_the_input_and_the_forms() {
        for bad in ["", "abc", "10 parsecs", "-3s", "1e999", "s"] {
            let e = parse_duration(bad).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{bad:?}")) && msg.contains("30s"),
                "{msg}"
            );
        }
    }
}
