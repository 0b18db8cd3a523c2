//! The conflicts lost, as the coordinator charged them: one entry per loser
//! of a dispute when its job settled, written in the group commit that
//! settles it.
//!
//! A worker's standing (how many conflicts it lost, and against whom) bans
//! it, and a ban voids every vote it cast. The coordinator charges a loss
//! when a disputed job settles, judged with the reputations of that moment;
//! a copy that comes after is only kept. Judging every stored copy again at
//! a restart cannot know those moments: it charged lies that came after a
//! job settled, and counted votes of identities that were banned by then,
//! so a restart could ban an honest identity and reopen every job it
//! counted (about 1 % of the simulated restores). Reading back what was
//! charged gives a restart the standings the run had.

use crate::codec::{key_u64, open, put_str, put_varint, seal};
use crate::error::{Corruption, Result};
use crate::{JobId, LOSSES_KEPT, Store};

/// The `losses` tree's value format.
const LOSS_VERSION: u8 = 1;

/// A conflict that `identity` lost when a disputed job settled, and whom it
/// lost against, as far as a ban cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredLoss {
    /// The identity charged.
    pub identity: String,
    /// A trusted computation decided the dispute.
    pub by_trusted: bool,
    /// The credentialed identities among the winners.
    pub by_credentials: Vec<String>,
}

impl StoredLoss {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![LOSS_VERSION];
        put_str(&mut out, &self.identity);
        out.push(u8::from(self.by_trusted));
        put_varint(&mut out, self.by_credentials.len() as u128);
        for name in &self.by_credentials {
            put_str(&mut out, name);
        }
        seal(&mut out);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<StoredLoss> {
        let (_, mut r) = open("losses", bytes, 1, LOSS_VERSION)?;
        let identity = r.str()?;
        let by_trusted = r.flag("loss.by_trusted")?;
        let len = r.varint_u64()?;
        // Each name takes at least its length's bytes: a damaged length
        // cannot reserve more than the value holds.
        let len = usize::try_from(len).map_err(|_| r.corrupt(Corruption::Truncated))?;
        let mut by_credentials = Vec::with_capacity(len.min(r.remaining()));
        for _ in 0..len {
            by_credentials.push(r.str()?);
        }
        r.end()?;
        Ok(StoredLoss {
            identity,
            by_trusted,
            by_credentials,
        })
    }
}

impl Store {
    /// True when the `losses` tree holds every conflict charged in the run
    /// ([`crate::losses`]): the run was created by a build that keeps them,
    /// and every session since kept them ([`Store::keep_losses`]).
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn keeps_losses(&self) -> Result<bool> {
        Ok(self.losses_kept_up_to()? == Some(self.boot()?))
    }

    /// Notes that this session, `session` ([`Store::next_boot`]), keeps the
    /// conflicts it charges, and says whether the `losses` tree then holds
    /// every one of the run's: only if every session before kept them too.
    /// A session of a build that does not (a rollback, then this build
    /// again) breaks the chain for good, and the run is judged again from
    /// its copies, as one created before losses were kept. Not durable
    /// until a flush.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn keep_losses(&self, session: u64) -> Result<bool> {
        let kept = self.losses_kept_up_to()? == Some(session.saturating_sub(1));
        if kept {
            self.meta.insert(LOSSES_KEPT, session.to_be_bytes())?;
        } else {
            self.meta.remove(LOSSES_KEPT)?;
        }
        Ok(kept)
    }

    /// The last session that kept its losses, with every one before it.
    fn losses_kept_up_to(&self) -> Result<Option<u64>> {
        Ok(self
            .meta
            .get(LOSSES_KEPT)?
            .and_then(|b| <[u8; 8]>::try_from(&b[..]).ok())
            .map(u64::from_be_bytes))
    }

    /// The conflicts lost in one job, in the order charged.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Corrupt`] (a damaged value), sled errors.
    pub fn job_losses(&self, job: JobId) -> Result<Vec<StoredLoss>> {
        self.losses
            .scan_prefix(job.key())
            .map(|entry| StoredLoss::decode(&entry?.1))
            .collect()
    }

    /// Every conflict lost, in job order.
    pub fn losses(&self) -> impl Iterator<Item = Result<(JobId, StoredLoss)>> + 'static {
        self.losses.iter().map(|entry| {
            let (k, v) = entry?;
            let job = key_u64("losses", k.get(..8).unwrap_or(&[]))?;
            Ok((JobId(job), StoredLoss::decode(&v)?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_round_trip_and_damage_is_refused() {
        let loss = StoredLoss {
            identity: "token:liar".into(),
            by_trusted: false,
            by_credentials: vec!["token:a".into(), "cert:0f".into()],
        };
        let bytes = loss.encode();
        assert_eq!(StoredLoss::decode(&bytes).unwrap(), loss);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(
                StoredLoss::decode(&bad).is_err(),
                "flip at byte {i} went unseen"
            );
        }
    }
}
