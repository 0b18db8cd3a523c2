//! The settings that decide what counts (`--verify`, `--trust`,
//! `--ban-after`, `--gpu-sample`; probation follows `--verify`) travel
//! with the run: they are stored when the run is created, and a resume
//! judges by the stored values. A resume that gives another value is
//! refused, naming both, unless `--change-settings` says to change it; the
//! change is then logged as a warning, stored, and listed in `report.json`.
//!
//! `--gpu-sample` was stored later than the others. A run whose stored
//! settings lack it resumes with this session's value (the default,
//! [`crate::core::quorum::DEFAULT_GPU_SAMPLE`], unless given) and stores
//! it; a finished run or an audit of such a run judges with no CPU sample
//! ([`UNSTORED_GPU_SAMPLE`]), as the build that ran it did.

use std::num::NonZeroU32;
use std::time::SystemTime;

use nq_store::{RunSettings, SettingChange, Store};
use tracing::{info, warn};

use crate::config::Config;
use crate::core::quorum::{Fraction, Policy};
use crate::error::{Error, Result};
use crate::wall::unix_ms;

/// The CPU sample share of a run whose stored settings predate
/// `--gpu-sample`, when it is judged without a session that could adopt
/// one (a finished run's report, the audit): none, as the builds that
/// stored such settings took no CPU sample. Judging such a run with a
/// sample would reopen GPU-only jobs that it rightly settled.
const UNSTORED_GPU_SAMPLE: f64 = 0.0;

/// The settings a session judges by.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Deciding {
    /// `--verify`.
    pub(crate) verify: Fraction,
    /// `--trust`, as [`crate::credentials::trusted_identity`] spells each.
    pub(crate) trusted: Vec<String>,
    /// `--ban-after`.
    pub(crate) ban_after: NonZeroU32,
    /// `--gpu-sample`.
    pub(crate) gpu_sample: f64,
}

impl Deciding {
    /// The values `config` holds, given or default.
    pub(crate) fn of_config(config: &Config) -> Deciding {
        Deciding {
            verify: config.verify,
            trusted: config.trusted.clone(),
            ban_after: config.ban_after,
            gpu_sample: config.gpu_sample,
        }
    }

    /// The values stored with a run ([`UNSTORED_GPU_SAMPLE`] for a
    /// `--gpu-sample` stored settings lack).
    fn of_stored(stored: &RunSettings) -> Result<Deciding> {
        let ban_after = NonZeroU32::new(stored.ban_after).ok_or_else(|| {
            nq_store::Error::Corrupt {
                tree: "meta",
                what: nq_store::Corruption::Field {
                    field: "run_settings.ban_after",
                },
            }
        })?;
        Ok(Deciding {
            verify: stored.verify.map_or(Fraction::Auto, Fraction::Fixed),
            trusted: stored.trust.clone(),
            ban_after,
            gpu_sample: stored.gpu_sample.unwrap_or(UNSTORED_GPU_SAMPLE),
        })
    }

    /// The record to store, with the run's `changes` so far.
    pub(crate) fn to_stored(&self, changes: Vec<SettingChange>) -> RunSettings {
        RunSettings {
            verify: match self.verify {
                Fraction::Auto => None,
                Fraction::Fixed(share) => Some(share),
            },
            trust: self.trusted.clone(),
            ban_after: self.ban_after.get(),
            gpu_sample: Some(self.gpu_sample),
            changes,
        }
    }

    /// These settings with the values `config` gives in place of theirs.
    fn with_given(&self, config: &Config) -> Deciding {
        let given = config.given;
        Deciding {
            verify: if given.verify {
                config.verify
            } else {
                self.verify
            },
            trusted: if given.trust {
                config.trusted.clone()
            } else {
                self.trusted.clone()
            },
            ban_after: if given.ban_after {
                config.ban_after
            } else {
                self.ban_after
            },
            gpu_sample: if given.gpu_sample {
                config.gpu_sample
            } else {
                self.gpu_sample
            },
        }
    }

    /// Each setting, by its option name, with its value as the option
    /// spells it.
    fn values(&self) -> [(&'static str, String); 4] {
        let verify = match self.verify {
            Fraction::Auto => "auto".to_owned(),
            Fraction::Fixed(share) => share.to_string(),
        };
        let mut trusted = self.trusted.clone();
        trusted.sort_unstable();
        trusted.dedup();
        let trust = if trusted.is_empty() {
            "(none)".to_owned()
        } else {
            trusted.join(",")
        };
        [
            ("verify", verify),
            ("trust", trust),
            ("ban-after", self.ban_after.to_string()),
            ("gpu-sample", self.gpu_sample.to_string()),
        ]
    }

    /// The settings whose values differ from `other`'s: (option, ours,
    /// theirs). The trusted identities compare as a set.
    fn differences(&self, other: &Deciding) -> Vec<(&'static str, String, String)> {
        self.values()
            .into_iter()
            .zip(other.values())
            .filter(|((_, ours), (_, theirs))| ours != theirs)
            .map(|((setting, ours), (_, theirs))| (setting, ours, theirs))
            .collect()
    }

    /// Says which settings a resumed run judges by.
    fn log_kept(&self) {
        let [verify, trust, ban_after, gpu_sample] =
            self.values().map(|(_, value)| value);
        info!(
            verify,
            trust, ban_after, gpu_sample, "judging by the settings stored with the run"
        );
    }

    /// The verification policy these settings make, keyed by the run's
    /// stored secret (drawn on its first session).
    pub(crate) fn policy(&self, store: &Store) -> Result<Policy> {
        Ok(Policy {
            secret: store.verify_secret(rand::random())?,
            fraction: self.verify,
            ban_after: self.ban_after.get(),
            gpu_sample: self.gpu_sample,
        })
    }
}

/// The settings a session of an existing run (made, or being made, in
/// `store`) judges by: the stored ones, with the given ones in their place
/// where `config` may change them. A run stored before settings were
/// stored adopts this session's, and stores them; so does one whose stored
/// settings lack `--gpu-sample`, for that one (the default unless given).
///
/// # Errors
///
/// [`Error::SettingsDiffer`] for a given setting that differs from the
/// stored one without [`Config::change_settings`]; the store's errors.
pub(crate) fn resume(config: &Config, store: &Store) -> Result<Deciding> {
    let Some(stored) = store.run_settings()? else {
        let adopted = Deciding::of_config(config);
        let [verify, trust, ban_after, gpu_sample] =
            adopted.values().map(|(_, value)| value);
        info!(
            verify,
            trust,
            ban_after,
            gpu_sample,
            "the run predates stored settings: storing this session's verify, trust, ban-after and gpu-sample with it; later resumes use them"
        );
        store.set_run_settings(&adopted.to_stored(Vec::new()))?;
        store.flush()?;
        return Ok(adopted);
    };
    let mut kept = Deciding::of_stored(&stored)?;
    // Stored before --gpu-sample travelled: nothing to hold this session
    // to, so its value (given or default) becomes the run's, as all of
    // them do for a run that predates stored settings.
    let adopted = stored.gpu_sample.is_none();
    if adopted {
        kept.gpu_sample = config.gpu_sample;
    }
    let wanted = kept.with_given(config);
    let differences = kept.differences(&wanted);
    if differences.is_empty() {
        if adopted {
            log_adopted_gpu_sample(kept.gpu_sample);
            store.set_run_settings(&kept.to_stored(stored.changes))?;
            store.flush()?;
        }
        kept.log_kept();
        return Ok(kept);
    }
    if !config.change_settings {
        return Err(Error::SettingsDiffer {
            dir: config.data_dir.clone(),
            differences: differences
                .iter()
                .map(|(setting, stored, given)| {
                    format!("--{setting}: stored {stored}, given {given}")
                })
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    if adopted {
        log_adopted_gpu_sample(wanted.gpu_sample);
    }
    let now = unix_ms(SystemTime::now());
    let mut changes = stored.changes;
    for (setting, from, to) in differences {
        warn!(
            setting,
            from = %from,
            to = %to,
            "changing a setting that decides what counts, as --change-settings asks; recorded with the run and in report.json"
        );
        changes.push(SettingChange {
            setting: setting.to_owned(),
            from,
            to,
            unix_ms: now,
        });
    }
    store.set_run_settings(&wanted.to_stored(changes))?;
    store.flush()?;
    wanted.log_kept();
    Ok(wanted)
}

/// Says that a run whose stored settings predate `--gpu-sample` stores
/// this session's share with them (see [`resume`]).
fn log_adopted_gpu_sample(share: f64) {
    info!(
        gpu_sample = share,
        "the run's stored settings predate --gpu-sample: storing this session's with them; later resumes use it"
    );
}

/// The changes made to the run's stored settings, for its report.
pub(crate) fn changes(store: &Store) -> Result<Vec<SettingChange>> {
    Ok(store.run_settings()?.map(|s| s.changes).unwrap_or_default())
}

/// The verification policy and trusted identities a reader of the run in
/// `store` judges its copies by (the audit, and a finished run's report): the stored settings, or for a
/// run stored before they were, `verify` with the default ban limit, no
/// trusted identity and no CPU sample ([`UNSTORED_GPU_SAMPLE`]).
///
/// # Errors
///
/// The store's.
pub(crate) fn judging(store: &Store, verify: Fraction) -> Result<(Policy, Vec<String>)> {
    let deciding = match store.run_settings()? {
        Some(stored) => Deciding::of_stored(&stored)?,
        None => Deciding {
            verify,
            trusted: Vec::new(),
            ban_after: crate::config::DEFAULT_BAN_AFTER_NONZERO,
            gpu_sample: UNSTORED_GPU_SAMPLE,
        },
    };
    Ok((deciding.policy(store)?, deciding.trusted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GivenSettings;

    fn config(verify: Fraction, trusted: &[&str], ban_after: u32) -> Config {
        let mut c = Config::new(8, "d").unwrap();
        c.verify = verify;
        c.trusted = trusted.iter().map(|t| (*t).to_owned()).collect();
        c.ban_after = NonZeroU32::new(ban_after).unwrap();
        c.given = GivenSettings {
            verify: true,
            trust: true,
            ban_after: true,
            gpu_sample: true,
        };
        c
    }

    /// [`config`] with `--gpu-sample` at `share`.
    fn sampling(share: f64) -> Config {
        let mut c = config(Fraction::Fixed(0.0), &[], 3);
        c.gpu_sample = share;
        c
    }

    /// Stores settings as a build from before `--gpu-sample` was stored
    /// left them: the others as `made` gives them, no CPU sample share.
    fn store_without_gpu_sample(store: &Store, made: &Config) {
        let stored = RunSettings {
            gpu_sample: None,
            ..Deciding::of_config(made).to_stored(Vec::new())
        };
        store.set_run_settings(&stored).unwrap();
    }

    #[test]
    fn a_resume_takes_the_stored_settings_it_does_not_give() {
        let store = Store::temporary().unwrap();
        let made = config(Fraction::Fixed(0.0), &["token:lab"], 2);
        store
            .set_run_settings(&Deciding::of_config(&made).to_stored(Vec::new()))
            .unwrap();
        // Nothing given: the stored values, whatever the defaults say.
        let bare = Config::new(8, "d").unwrap();
        assert_eq!(resume(&bare, &store).unwrap(), Deciding::of_config(&made));
        // The same values given, the trusted ones in another order: no
        // difference.
        let mut same = config(Fraction::Fixed(0.0), &["token:lab", "token:lab"], 2);
        same.given.verify = false;
        assert_eq!(resume(&same, &store).unwrap(), Deciding::of_config(&made));
        assert!(changes(&store).unwrap().is_empty());
    }

    #[test]
    fn a_different_setting_is_refused_naming_both_values_unless_changed() {
        let store = Store::temporary().unwrap();
        let made = config(Fraction::Fixed(0.0), &[], 3);
        store
            .set_run_settings(&Deciding::of_config(&made).to_stored(Vec::new()))
            .unwrap();
        let mut other = config(Fraction::Fixed(1.0), &[], 3);
        let err = resume(&other, &store).unwrap_err().to_string();
        assert!(
            err.contains("--verify: stored 0, given 1")
                && err.contains("--change-settings"),
            "{err}"
        );
        assert!(!err.contains("--ban-after"), "{err}");
        other.change_settings = true;
        assert_eq!(resume(&other, &store).unwrap(), Deciding::of_config(&other));
        let recorded = changes(&store).unwrap();
        assert_eq!(recorded.len(), 1);
        assert_eq!(
            (&*recorded[0].setting, &*recorded[0].from, &*recorded[0].to),
            ("verify", "0", "1")
        );
        // The change is stored: the next resume takes the new value.
        let bare = Config::new(8, "d").unwrap();
        assert_eq!(resume(&bare, &store).unwrap().verify, Fraction::Fixed(1.0));
    }

    #[test]
    fn an_old_run_adopts_the_settings_of_its_first_resume() {
        let store = Store::temporary().unwrap();
        let first = config(Fraction::Auto, &["token:a"], 4);
        assert_eq!(resume(&first, &store).unwrap(), Deciding::of_config(&first));
        let stored = store.run_settings().unwrap().unwrap();
        assert_eq!((stored.verify, stored.ban_after), (None, 4));
        assert_eq!(stored.trust, ["token:a"]);
        assert_eq!(stored.gpu_sample, Some(first.gpu_sample));
        let (policy, trusted) = judging(&store, Fraction::Fixed(1.0)).unwrap();
        assert_eq!((policy.fraction, policy.ban_after), (Fraction::Auto, 4));
        assert_eq!(policy.gpu_sample, first.gpu_sample);
        assert_eq!(trusted, ["token:a"]);
    }

    /// `--gpu-sample` travels with the run as `--verify` does: a resume
    /// without it takes the stored share, not the default; another share is
    /// refused naming the flag and both values, unless changed.
    #[test]
    fn the_gpu_sample_travels_with_the_run() {
        let store = Store::temporary().unwrap();
        let made = sampling(0.25);
        store
            .set_run_settings(&Deciding::of_config(&made).to_stored(Vec::new()))
            .unwrap();
        assert_eq!(
            store.run_settings().unwrap().unwrap().gpu_sample,
            Some(0.25)
        );
        let bare = Config::new(8, "d").unwrap();
        let kept = resume(&bare, &store).unwrap();
        assert_eq!(kept.gpu_sample, 0.25);
        assert_eq!(kept.policy(&store).unwrap().gpu_sample, 0.25);
        // The same share given: no difference.
        assert_eq!(resume(&sampling(0.25), &store).unwrap().gpu_sample, 0.25);

        let mut other = sampling(crate::core::quorum::DEFAULT_GPU_SAMPLE);
        let err = resume(&other, &store).unwrap_err();
        assert!(matches!(err, Error::SettingsDiffer { .. }), "{err}");
        let err = err.to_string();
        assert!(
            err.contains("--gpu-sample: stored 0.25, given 0.005")
                && err.contains("--change-settings"),
            "{err}"
        );
        assert!(!err.contains("--verify"), "{err}");
        // Refused: nothing changed.
        assert_eq!(
            store.run_settings().unwrap().unwrap().gpu_sample,
            Some(0.25)
        );

        other.change_settings = true;
        assert_eq!(resume(&other, &store).unwrap().gpu_sample, 0.005);
        let recorded = changes(&store).unwrap();
        assert_eq!(recorded.len(), 1);
        assert_eq!(
            (&*recorded[0].setting, &*recorded[0].from, &*recorded[0].to),
            ("gpu-sample", "0.25", "0.005")
        );
        assert_eq!(resume(&bare, &store).unwrap().gpu_sample, 0.005);
        // The audit, and with it a finished run's report, judge by the
        // stored share too.
        let (policy, _) = judging(&store, Fraction::Auto).unwrap();
        assert_eq!(policy.gpu_sample, 0.005);
    }

    /// Settings stored before `--gpu-sample` travelled still resume: with
    /// the default when none is given, else with the given share, which no
    /// stored share can differ from; the share is stored then, and held to
    /// from the next resume on.
    #[test]
    fn settings_stored_without_a_gpu_sample_resume_and_store_one() {
        let made = config(Fraction::Fixed(0.5), &["token:lab"], 2);
        let bare = Config::new(8, "d").unwrap();

        let store = Store::temporary().unwrap();
        store_without_gpu_sample(&store, &made);
        let resumed = resume(&bare, &store).unwrap();
        assert_eq!(
            resumed,
            Deciding {
                gpu_sample: crate::core::quorum::DEFAULT_GPU_SAMPLE,
                ..Deciding::of_config(&made)
            }
        );
        let stored = store.run_settings().unwrap().unwrap();
        assert_eq!(
            stored.gpu_sample,
            Some(crate::core::quorum::DEFAULT_GPU_SAMPLE)
        );
        assert!(stored.changes.is_empty(), "{:?}", stored.changes);

        let store = Store::temporary().unwrap();
        store_without_gpu_sample(&store, &made);
        let mut given = Config::new(8, "d").unwrap();
        given.gpu_sample = 0.02;
        given.given.gpu_sample = true;
        assert_eq!(resume(&given, &store).unwrap().gpu_sample, 0.02);
        assert_eq!(
            store.run_settings().unwrap().unwrap().gpu_sample,
            Some(0.02)
        );
        assert!(changes(&store).unwrap().is_empty());
        // Stored now: the next resume is held to it.
        let err = resume(&sampling(0.03), &store).unwrap_err().to_string();
        assert!(
            err.contains("--gpu-sample: stored 0.02, given 0.03"),
            "{err}"
        );

        // Read without a session to adopt one, such a run is judged as it
        // was run: with no CPU sample.
        let store = Store::temporary().unwrap();
        store_without_gpu_sample(&store, &made);
        let (policy, _) = judging(&store, Fraction::Auto).unwrap();
        assert_eq!(policy.gpu_sample, 0.0);
        assert_eq!(store.run_settings().unwrap().unwrap().gpu_sample, None);
    }
}
