//! The machine controller's pace: the last look at each machine in progress, which tells an
//! echo of a machine's own status write from a reason to look again (ADR 0034) and spaces the
//! looks at a machine that stands still, and the looks one machine asks of others (ADR 0043).

use std::collections::BTreeMap;

use ichor_api::TalosMachine;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::plan;

/// The last look at each machine in progress, with whether a related object woke it since:
/// what tells an echo of a machine's own writes from a reason to look again
/// (`plan::echo_wait`, ADR 0034), and how long a machine that stands still waits for its next
/// look (`plan::next_look`). Also the looks one machine asks of others ([`Looks::ask`]).
#[derive(Debug)]
pub struct Looks {
    last: std::sync::Mutex<BTreeMap<String, plan::LastLook>>,
    asked: tokio::sync::broadcast::Sender<ObjectRef<TalosMachine>>,
}

/// How many asked looks wait for the machine controller at most; past that the oldest are
/// dropped, and those machines are seen at their own pace (a queued machine's is the
/// progress pace).
const ASKED_LOOKS: usize = 1024;

impl Default for Looks {
    fn default() -> Self {
        Self {
            last: std::sync::Mutex::default(),
            asked: tokio::sync::broadcast::channel(ASKED_LOOKS).0,
        }
    }
}

impl Looks {
    /// Asks the machine controller to look at `machines` now, as woken by a related object
    /// (so none is taken for an echo): what a machine's end of its drift turn, or its becoming
    /// Ready, tells the machines queued behind it (ADR 0043).
    pub fn ask(&self, machines: &[ObjectRef<TalosMachine>]) {
        self.wake(machines);
        for machine in machines {
            // No controller listening (a test's context): nothing to wake.
            let _ = self.asked.send(machine.clone());
        }
    }

    /// The looks asked from now on ([`Looks::ask`]), for the machine controller's
    /// `reconcile_on`.
    pub fn asked(&self) -> impl futures::Stream<Item = ObjectRef<TalosMachine>> + Send + 'static {
        futures::stream::unfold(self.asked.subscribe(), |mut asked| async move {
            loop {
                match asked.recv().await {
                    Ok(machine) => return Some((machine, asked)),
                    // Dropped looks: those machines keep their own pace.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// Records that a related object (its cluster, a class, a storage) woke these machines:
    /// their next reconcile looks. A machine without a last look looks anyway.
    pub fn wake(&self, machines: &[ObjectRef<TalosMachine>]) {
        let mut last = lock(&self.last);
        for machine in machines {
            if let Some(look) = last.get_mut(&machine.to_string()) {
                look.woken = true;
            }
        }
    }

    /// How long this reconcile of `machine` waits as an echo of its own last look, if it is
    /// one; a wake by a related object is used up by the look it causes.
    pub(super) fn echo(
        &self,
        machine: &TalosMachine,
        now: std::time::Instant,
    ) -> Option<std::time::Duration> {
        let key = ObjectRef::from_obj(machine).to_string();
        let mut last = lock(&self.last);
        let look = last.get_mut(&key)?;
        let wait = plan::echo_wait(Some(*look), plan::looked_at(machine), now);
        if wait.is_none() {
            look.woken = false;
        }
        wait
    }

    /// Records a look at `machine` that saw `seen`, found it standing at `standing`, and
    /// ended with `action`; returns the action to take. A machine in progress (looked at again
    /// after `progress`) keeps its look, and waits longer the longer it stands still; any
    /// other forgets it.
    pub(super) fn record(
        &self,
        machine: &TalosMachine,
        (seen, standing): (u64, u64),
        action: Action,
        progress: std::time::Duration,
    ) -> Action {
        let key = ObjectRef::from_obj(machine).to_string();
        let mut last = lock(&self.last);
        if action == Action::requeue(progress) {
            let now = std::time::Instant::now();
            let next = plan::next_look(last.get(&key).copied(), seen, standing, progress, now);
            last.insert(key, next);
            Action::requeue(next.due - now)
        } else {
            last.remove(&key);
            action
        }
    }
}

/// `mutex` locked; a poisoned lock is taken as it stands (the data it guards is a cache).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
