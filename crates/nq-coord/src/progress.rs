//! Progress snapshots, published on a `watch` channel for whoever displays them.

use std::time::Duration;

/// Where a run stands. Work is measured in the split's estimate units, so the
/// fraction done is weighted by expected cost, not by job count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// Jobs in the run.
    pub jobs: u64,
    /// Jobs with an accepted result.
    pub jobs_done: u64,
    /// Jobs currently leased (to remote workers or the local threads).
    pub jobs_leased: u64,
    /// Estimated work of the whole run.
    pub work_total: u128,
    /// Estimated work of the jobs done.
    pub work_done: u128,
    /// Remote workers heard from within the last lease TTL.
    pub workers: usize,
    /// Solutions counted so far (Q(N) once complete).
    pub total_so_far: u128,
    /// True once every job is done.
    pub complete: bool,
    /// Time spent in this session.
    pub elapsed: Duration,
    /// Jobs done in this session (for rates: earlier sessions' jobs took no
    /// time here).
    pub jobs_done_here: u64,
    /// Estimated work done in this session.
    pub work_done_here: u128,
}

impl Progress {
    /// The fraction of the estimated work done, 0.0 to 1.0.
    pub fn fraction(&self) -> f64 {
        if self.work_total == 0 {
            return if self.complete { 1.0 } else { 0.0 };
        }
        (self.work_done as f64 / self.work_total as f64).clamp(0.0, 1.0)
    }

    /// Jobs done per second in this session.
    pub fn jobs_per_second(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.jobs_done_here as f64 / s
        } else {
            0.0
        }
    }

    /// Estimated time to completion, from this session's rate of work, or
    /// `None` before any work was done here.
    pub fn eta(&self) -> Option<Duration> {
        if self.complete {
            return Some(Duration::ZERO);
        }
        if self.work_done_here == 0 {
            return None;
        }
        let left = self.work_total.saturating_sub(self.work_done) as f64;
        let per_unit = self.elapsed.as_secs_f64() / self.work_done_here as f64;
        Duration::try_from_secs_f64(left * per_unit).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_follows_the_work_rate() {
        let p = Progress {
            work_total: 100,
            work_done: 50,
            work_done_here: 25,
            jobs_done_here: 5,
            elapsed: Duration::from_secs(10),
            ..Progress::default()
        };
        assert_eq!(p.fraction(), 0.5);
        assert_eq!(p.jobs_per_second(), 0.5);
        assert_eq!(p.eta(), Some(Duration::from_secs(20)));
        assert_eq!(Progress::default().eta(), None);
    }
}
