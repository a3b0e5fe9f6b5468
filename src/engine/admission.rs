//! Start admission: when many canaries start at once, they take their first steps
//! in the order they arrived, a few at a time, instead of all interleaved.
//!
//! The steps before a canary's first wait (snapshot, peers, plan, down, up) are work of
//! canaryd's and of the host's; 200 canaries started together share the cores, and with every
//! canary interleaved with every other the median one sends its `up` only when nearly all of
//! them have: each is as late as the whole burst. Admitted in order, the first ones are done
//! while the last ones queue, and the median waits half as long; the burst itself is no longer.
//!
//! A permit is held from the rollout's first step until its first step that waits (a health
//! or log wait, a soak, an analysis, an approval, a smoke test), its end, or `hold` (default
//! 1 s), whichever comes first: a host that answers slowly (a real `up` pulls images for
//! minutes) holds a permit for `hold` at most, so the gate never delays a canary by more than
//! its place in the queue × `hold` / `concurrency`. Rollbacks are not gated: an operator's
//! rollback never queues behind canaries.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::domain::runbook::StepKind;

/// The gate: `concurrency` permits, handed out in arrival order (tokio's semaphore is fair).
#[derive(Debug)]
pub(crate) struct StartGate {
    permits: Arc<Semaphore>,
    hold: Duration,
}

/// An admitted rollout's permit, given back by [`Admitted::release`], by its drop, or by a
/// timer after the gate's `hold`.
#[derive(Debug)]
pub(crate) struct Admitted {
    permit: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl StartGate {
    /// A gate of `concurrency` permits (at least 1), each held `hold` at most.
    pub(crate) fn new(concurrency: usize, hold: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            hold,
        }
    }

    /// Waits for a permit, in arrival order.
    pub(crate) async fn admit(&self) -> Admitted {
        // The semaphore is never closed, so `acquire_owned` cannot fail; if it ever did, the
        // rollout goes on ungated rather than stopping.
        let permit = Arc::new(Mutex::new(
            Arc::clone(&self.permits).acquire_owned().await.ok(),
        ));
        let timer = Arc::downgrade(&permit);
        let hold = self.hold;
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            if let Some(permit) = timer.upgrade() {
                take(&permit);
            }
        });
        Admitted { permit }
    }

    /// Permits free now (for tests).
    #[cfg(test)]
    fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

impl Admitted {
    /// Gives the permit back (a no-op once given back).
    pub(crate) fn release(&self) {
        take(&self.permit);
    }
}

fn take(permit: &Mutex<Option<OwnedSemaphorePermit>>) {
    let taken = permit.lock().map(|mut p| p.take());
    drop(taken);
}

/// Whether a step waits on the engine or a person (its start ends the rollout's admission).
/// Every kind is named, so a new one is classed when it is added. `peers_healthy` polls only
/// while a peer is unhealthy, which `start_hold` bounds.
pub(crate) fn waits(kind: &StepKind) -> bool {
    match kind {
        StepKind::WaitHealth(_)
        | StepKind::WaitLogs(_)
        | StepKind::Soak(_)
        | StepKind::Analyze(_)
        | StepKind::Approve(_)
        | StepKind::Window(_)
        | StepKind::Smoke(_) => true,
        StepKind::Snapshot(_)
        | StepKind::FreeSpace(_)
        | StepKind::PeersHealthy(_)
        | StepKind::Plan(_)
        | StepKind::Stage(_)
        | StepKind::Down(_)
        | StepKind::Up(_)
        | StepKind::VerifyNeighbours(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::StartGate;

    /// Permits go in arrival order: the third comer waits for the first's release, not the
    /// second's, and a permit not released comes back after `hold`.
    #[tokio::test(start_paused = true)]
    async fn permits_go_in_arrival_order_and_come_back_after_the_hold() {
        let gate = std::sync::Arc::new(StartGate::new(2, Duration::from_secs(1)));
        let first = gate.admit().await;
        let _second = gate.admit().await;
        assert_eq!(gate.available(), 0);
        let comer = || {
            let gate = std::sync::Arc::clone(&gate);
            tokio::spawn(async move { gate.admit().await })
        };
        let third = comer();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let fourth = comer();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!third.is_finished(), "no permit free: the third waits");
        first.release();
        first.release();
        let third = tokio::time::timeout(Duration::from_millis(100), third)
            .await
            .expect("admitted once the first released")
            .expect("task");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !fourth.is_finished(),
            "the fourth came later: it still waits"
        );
        assert_eq!(gate.available(), 0, "a second release gives nothing back");
        drop(third);
        let fourth = tokio::time::timeout(Duration::from_millis(100), fourth)
            .await
            .expect("admitted once the third's permit was dropped")
            .expect("task");
        drop(fourth);
        assert_eq!(gate.available(), 1, "a drop gives the permit back");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(
            gate.available(),
            2,
            "the second's permit came back after the hold"
        );
    }
}
