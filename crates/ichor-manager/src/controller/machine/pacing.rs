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
    /// Each machine as stored, as the look at it in flight last read or wrote it
    /// ([`Looks::stored`]); forgotten when that look ends.
    stored: std::sync::Mutex<BTreeMap<String, TalosMachine>>,
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
            stored: std::sync::Mutex::default(),
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
        // Dropped looks: those machines keep their own pace.
        crate::infra::shared::broadcast_stream(self.asked.subscribe())
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

impl Looks {
    /// Keeps `machine` as just read as stored, for the rest of the look at it.
    pub(super) fn keep_stored(&self, machine: &TalosMachine) {
        let key = ObjectRef::from_obj(machine).to_string();
        lock(&self.stored).insert(key, machine.clone());
    }

    /// The newest copy of `machine` as stored that the look at it in flight read or wrote,
    /// if any: the base of a write checked against its version (a copy that is no longer the
    /// current version conflicts, and the writer reads it again), so that a look's writes one
    /// after another need no read before each.
    pub(crate) fn stored(&self, machine: &TalosMachine) -> Option<TalosMachine> {
        let key = ObjectRef::from_obj(machine).to_string();
        lock(&self.stored).get(&key).cloned()
    }

    /// Keeps `written`, the machine as a write just stored it, if a look at it is in flight.
    pub(crate) fn wrote(&self, written: TalosMachine) {
        let key = ObjectRef::from_obj(&written).to_string();
        if let Some(kept) = lock(&self.stored).get_mut(&key) {
            *kept = written;
        }
    }

    /// Forgets what the look at `machine` kept ([`Looks::keep_stored`]): the look ended.
    pub(super) fn look_ended(&self, machine: &TalosMachine) {
        let key = ObjectRef::from_obj(machine).to_string();
        lock(&self.stored).remove(&key);
    }
}

/// `mutex` locked; a poisoned lock is taken as it stands (the data it guards is a cache).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(name: &str, version: &str) -> TalosMachine {
        let mut machine = TalosMachine::test(name).namespace("ns").build();
        machine.metadata.resource_version = Some(version.to_owned());
        machine
    }

    fn version(copy: Option<TalosMachine>) -> Option<String> {
        copy.and_then(|m| m.metadata.resource_version)
    }

    #[test]
    fn a_look_keeps_the_newest_copy_it_read_or_wrote_until_it_ends() {
        let looks = Looks::default();
        // No look in flight: nothing is kept, and a write outside a look keeps nothing.
        looks.wrote(at("m1", "5"));
        assert_eq!(version(looks.stored(&at("m1", "1"))), None);

        looks.keep_stored(&at("m1", "7"));
        assert_eq!(version(looks.stored(&at("m1", "1"))), Some("7".into()));
        looks.wrote(at("m1", "8"));
        assert_eq!(
            version(looks.stored(&at("m1", "1"))),
            Some("8".into()),
            "the look's own write is its newest copy"
        );
        assert_eq!(version(looks.stored(&at("m2", "1"))), None, "per machine");

        looks.look_ended(&at("m1", "8"));
        assert_eq!(version(looks.stored(&at("m1", "1"))), None, "forgotten");
    }
}
