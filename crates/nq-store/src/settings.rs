//! The settings that decide what counts in a run ([`RunSettings`]: the
//! verification share, the trusted identities, the ban limit and the CPU
//! sample of GPU copies), stored
//! with the run when it is created, as its split is, so that every later
//! session judges its copies by the same rules; and the changes an
//! operator made to them on a resume.
//!
//! One value in the `meta` tree, `run_settings`, sealed like the manifest.
//! The store keeps them as plain data: what they mean is the coordinator's.

use crate::Store;
use crate::codec::{Reader, open, put_str, put_varint, seal};
use crate::error::{Corruption, Result};

/// The key of the settings in the `meta` tree.
const SETTINGS: &[u8] = b"run_settings";

/// Format version of [`RunSettings`]' encoding (sealed from the first).
/// Version 2 added [`RunSettings::gpu_sample`]; a version 1 value still
/// reads, with none stored.
const SETTINGS_VERSION: u8 = 2;

/// The settings that decide what counts in a run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSettings {
    /// The share of jobs computed twice (`--verify`): `None` for `auto`,
    /// else a share from 0 to 1.
    pub verify: Option<f64>,
    /// The identities the operator trusts (`--trust`), as the coordinator
    /// spells them.
    pub trust: Vec<String>,
    /// Lost verification conflicts after which a worker is refused
    /// (`--ban-after`).
    pub ban_after: u32,
    /// The share of the jobs, 0 to 1, whose copies all ran on a GPU that a
    /// trusted CPU kernel computes again (`--gpu-sample`); `None` for
    /// settings stored before it was (format version 1), which the
    /// coordinator fills in.
    pub gpu_sample: Option<f64>,
    /// Every change made to these settings after the run was created,
    /// oldest first.
    pub changes: Vec<SettingChange>,
}

/// One change of a stored setting, made on a resume that asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingChange {
    /// The setting, by its option name without dashes (`verify`).
    pub setting: String,
    /// Its value before, as the option spells it.
    pub from: String,
    /// Its value after.
    pub to: String,
    /// When it changed, milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

/// Writes an optional share: a tag byte (0: none, 1: one), then its bits.
fn put_share(out: &mut Vec<u8>, share: Option<f64>) {
    match share {
        None => out.push(0),
        Some(share) => {
            out.push(1);
            out.extend_from_slice(&share.to_bits().to_be_bytes());
        }
    }
}

/// Reads what [`put_share`] wrote; a share outside 0 to 1 or a bad tag is
/// a damaged `field`.
fn share(r: &mut Reader<'_>, field: &'static str) -> Result<Option<f64>> {
    match r.u8()? {
        0 => Ok(None),
        1 => {
            let share = f64::from_bits(r.u64()?);
            if !(0.0..=1.0).contains(&share) {
                return Err(r.corrupt(Corruption::Field { field }));
            }
            Ok(Some(share))
        }
        _ => Err(r.corrupt(Corruption::Field { field })),
    }
}

impl RunSettings {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![SETTINGS_VERSION];
        put_share(&mut out, self.verify);
        put_varint(&mut out, self.trust.len() as u128);
        for identity in &self.trust {
            put_str(&mut out, identity);
        }
        put_varint(&mut out, self.ban_after.into());
        put_share(&mut out, self.gpu_sample);
        put_varint(&mut out, self.changes.len() as u128);
        for change in &self.changes {
            put_str(&mut out, &change.setting);
            put_str(&mut out, &change.from);
            put_str(&mut out, &change.to);
            out.extend_from_slice(&change.unix_ms.to_be_bytes());
        }
        seal(&mut out);
        out
    }

    fn decode(bytes: &[u8]) -> Result<RunSettings> {
        let (version, mut r) = open("meta", bytes, 1, SETTINGS_VERSION)?;
        let field = |r: &Reader<'_>, field| r.corrupt(Corruption::Field { field });
        let verify = share(&mut r, "run_settings.verify")?;
        let count = r.varint_u64()?;
        // Each string takes at least its length byte: a damaged count
        // reserves no more than the value can hold.
        let mut trust = Vec::with_capacity(r.remaining().min(count as usize));
        for _ in 0..count {
            trust.push(r.str()?);
        }
        let ban_after = u32::try_from(r.varint()?)
            .ok()
            .filter(|&k| k > 0)
            .ok_or_else(|| field(&r, "run_settings.ban_after"))?;
        let gpu_sample = if version >= 2 {
            share(&mut r, "run_settings.gpu_sample")?
        } else {
            None
        };
        let count = r.varint_u64()?;
        // A change takes at least 11 bytes: three lengths and its time.
        let mut changes = Vec::with_capacity((r.remaining() / 11).min(count as usize));
        for _ in 0..count {
            changes.push(SettingChange {
                setting: r.str()?,
                from: r.str()?,
                to: r.str()?,
                unix_ms: r.u64()?,
            });
        }
        r.end()?;
        Ok(RunSettings {
            verify,
            trust,
            ban_after,
            gpu_sample,
            changes,
        })
    }
}

impl Store {
    /// The settings stored with the run; `None` for a store made before
    /// they were stored (or before its run was created).
    ///
    /// # Errors
    ///
    /// sled errors, [`crate::Error::Corrupt`] for a damaged value.
    pub fn run_settings(&self) -> Result<Option<RunSettings>> {
        self.meta
            .get(SETTINGS)?
            .map(|b| RunSettings::decode(&b))
            .transpose()
    }

    /// Stores the run's settings, replacing any stored before. Not durable
    /// until a flush.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn set_run_settings(&self, settings: &RunSettings) -> Result<()> {
        self.meta.insert(SETTINGS, settings.encode())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::Error;

    fn sample() -> RunSettings {
        RunSettings {
            verify: Some(0.05),
            trust: vec!["token:lab".into(), "cert:ab12".into()],
            ban_after: 3,
            gpu_sample: Some(0.005),
            changes: vec![SettingChange {
                setting: "verify".into(),
                from: "0".into(),
                to: "0.05".into(),
                unix_ms: 1_700_000_000_000,
            }],
        }
    }

    #[test]
    fn settings_round_trip_through_the_store() {
        let store = Store::temporary().unwrap();
        assert_eq!(store.run_settings().unwrap(), None);
        for settings in [
            sample(),
            RunSettings {
                verify: None,
                trust: Vec::new(),
                ban_after: 1,
                gpu_sample: None,
                changes: Vec::new(),
            },
        ] {
            store.set_run_settings(&settings).unwrap();
            assert_eq!(store.run_settings().unwrap(), Some(settings));
        }
    }

    #[test]
    fn damaged_or_out_of_range_settings_are_refused() {
        let mut bytes = sample().encode();
        bytes[3] ^= 1;
        assert!(matches!(
            RunSettings::decode(&bytes),
            Err(Error::Corrupt {
                tree: "meta",
                what: Corruption::Checksum
            })
        ));
        for bad in [
            RunSettings {
                verify: Some(1.5),
                ..sample()
            },
            RunSettings {
                ban_after: 0,
                ..sample()
            },
            RunSettings {
                gpu_sample: Some(-0.5),
                ..sample()
            },
        ] {
            let err = RunSettings::decode(&bad.encode()).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Corrupt {
                        what: Corruption::Field { .. },
                        ..
                    }
                ),
                "{err}"
            );
        }
        let mut truncated = sample().encode();
        truncated.truncate(truncated.len() - 6);
        assert!(RunSettings::decode(&truncated).is_err());
    }

    /// `settings` as format version 1 wrote it: no `gpu_sample`.
    fn encode_v1(settings: &RunSettings) -> Vec<u8> {
        let mut out = vec![1];
        put_share(&mut out, settings.verify);
        put_varint(&mut out, settings.trust.len() as u128);
        for identity in &settings.trust {
            put_str(&mut out, identity);
        }
        put_varint(&mut out, settings.ban_after.into());
        put_varint(&mut out, settings.changes.len() as u128);
        for change in &settings.changes {
            put_str(&mut out, &change.setting);
            put_str(&mut out, &change.from);
            put_str(&mut out, &change.to);
            out.extend_from_slice(&change.unix_ms.to_be_bytes());
        }
        seal(&mut out);
        out
    }

    /// A store written before `--gpu-sample` was stored still reads: the
    /// other settings as written, and no CPU sample share.
    #[test]
    fn version_1_settings_read_without_a_gpu_sample() {
        let old = RunSettings {
            gpu_sample: None,
            ..sample()
        };
        assert_eq!(RunSettings::decode(&encode_v1(&old)).unwrap(), old);
    }

    fn settings() -> impl Strategy<Value = RunSettings> {
        let change =
            (".*", ".*", ".*", any::<u64>()).prop_map(|(setting, from, to, unix_ms)| {
                SettingChange {
                    setting,
                    from,
                    to,
                    unix_ms,
                }
            });
        (
            proptest::option::of(0.0..=1.0f64),
            vec(".*", 0..4),
            1..=u32::MAX,
            proptest::option::of(0.0..=1.0f64),
            vec(change, 0..4),
        )
            .prop_map(|(verify, trust, ban_after, gpu_sample, changes)| {
                RunSettings {
                    verify,
                    trust,
                    ban_after,
                    gpu_sample,
                    changes,
                }
            })
    }

    proptest! {
        /// Every valid value reads back as written.
        #[test]
        fn settings_round_trip(s in settings()) {
            prop_assert_eq!(RunSettings::decode(&s.encode()).unwrap(), s);
        }

        /// Arbitrary bytes decode to a value or to `Corrupt`, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..256)) {
            if let Err(e) = RunSettings::decode(&bytes) {
                prop_assert!(matches!(e, Error::Corrupt { tree: "meta", .. }), "{}", e);
            }
        }

        /// A flipped bit anywhere in a stored value is refused.
        #[test]
        fn a_flipped_bit_is_refused(s in settings(), at in any::<prop::sample::Index>(), bit in 0..8u8) {
            let mut bytes = s.encode();
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
            prop_assert!(RunSettings::decode(&bytes).is_err());
        }
    }
}
