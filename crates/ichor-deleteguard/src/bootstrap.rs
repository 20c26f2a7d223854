//! Bootstrap: which control plane, if any, gets etcd's one bootstrap call. Bootstrapping a
//! second member would start a second etcd cluster, so once a machine is recorded as chosen no
//! other is ever bootstrapped, and etcd running anywhere means none is.

/// A control plane that could bootstrap etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The TalosMachine's name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Whether it answers with mutual TLS now.
    pub reachable: bool,
    /// Members its etcd reports (empty: none, or not asked).
    pub members: usize,
}

/// The next bootstrap step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootstrapStep {
    /// etcd already runs somewhere: record it and never bootstrap.
    AlreadyRunning {
        /// The machine whose etcd reports members.
        name: String,
        /// Its UID.
        uid: String,
    },
    /// Record this machine before the call.
    Choose {
        /// The machine.
        name: String,
        /// Its UID.
        uid: String,
    },
    /// Bootstrap the recorded machine (idempotent: `AlreadyExists` is done).
    Call {
        /// The recorded machine.
        name: String,
    },
    /// The recorded machine is gone or unreachable; wait — never bootstrap another one.
    WaitForRecorded {
        /// The recorded machine.
        name: String,
    },
    /// No control plane can bootstrap yet.
    Wait,
}

/// Chooses the bootstrap step. With a record, only the recorded machine is ever bootstrapped.
/// Without one, any reachable control plane whose etcd reports members means the cluster is
/// bootstrapped already; otherwise the first reachable candidate by name is chosen.
pub fn bootstrap_step(record: Option<(&str, &str)>, candidates: &[Candidate]) -> BootstrapStep {
    if let Some((name, uid)) = record {
        return match candidates.iter().find(|c| c.name == name && c.uid == uid) {
            Some(c) if c.reachable => BootstrapStep::Call {
                name: name.to_owned(),
            },
            _ => BootstrapStep::WaitForRecorded {
                name: name.to_owned(),
            },
        };
    }
    if let Some(running) = candidates.iter().find(|c| c.members > 0) {
        return BootstrapStep::AlreadyRunning {
            name: running.name.clone(),
            uid: running.uid.clone(),
        };
    }
    let mut reachable: Vec<&Candidate> = candidates.iter().filter(|c| c.reachable).collect();
    reachable.sort_by(|a, b| a.name.cmp(&b.name));
    match reachable.first() {
        Some(c) => BootstrapStep::Choose {
            name: c.name.clone(),
            uid: c.uid.clone(),
        },
        None => BootstrapStep::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(name: &str, reachable: bool, members: usize) -> Candidate {
        Candidate {
            name: name.into(),
            uid: format!("uid-{name}"),
            reachable,
            members,
        }
    }

    #[test]
    fn a_record_pins_the_bootstrap_to_one_machine() {
        let all = [candidate("a", true, 0), candidate("b", true, 0)];
        assert_eq!(
            bootstrap_step(Some(("b", "uid-b")), &all),
            BootstrapStep::Call { name: "b".into() }
        );
        let without_b = [candidate("a", true, 0)];
        assert_eq!(
            bootstrap_step(Some(("b", "uid-b")), &without_b),
            BootstrapStep::WaitForRecorded { name: "b".into() },
            "never another machine while the record exists"
        );
        assert_eq!(
            bootstrap_step(Some(("b", "other-uid")), &all),
            BootstrapStep::WaitForRecorded { name: "b".into() },
            "a recreated machine of the same name is another machine"
        );
    }

    #[test]
    fn running_etcd_anywhere_means_no_bootstrap() {
        let all = [candidate("a", true, 0), candidate("c", true, 3)];
        assert_eq!(
            bootstrap_step(None, &all),
            BootstrapStep::AlreadyRunning {
                name: "c".into(),
                uid: "uid-c".into()
            }
        );
    }

    #[test]
    fn the_first_reachable_by_name_is_chosen_whatever_the_listing_order() {
        let one = [
            candidate("c", true, 0),
            candidate("a", false, 0),
            candidate("b", true, 0),
        ];
        let mut two = one.clone();
        two.reverse();
        for order in [&one[..], &two[..]] {
            assert_eq!(
                bootstrap_step(None, order),
                BootstrapStep::Choose {
                    name: "b".into(),
                    uid: "uid-b".into()
                }
            );
        }
        assert_eq!(
            bootstrap_step(None, &[candidate("a", false, 0)]),
            BootstrapStep::Wait
        );
    }
}
