//! What a [`TalosError`] means to a caller, decided on the variant and the gRPC code alone,
//! never on message text: its [`Category`] (someone must fix something, retry it, or a bug),
//! and for a refused `ApplyConfiguration`, why it was refused ([`ApplyRefusal`]).

use tonic::Code;

use crate::client::TalosError;

/// What kind of fault an error is: it tells a caller whether to wait for a fix or retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Someone must change something (the pin, the address, the config, the credentials'
    /// roles): retrying the same call gives the same answer.
    UserFix,
    /// The node is unreachable, busy or not ready yet: the same call may succeed later.
    Transient,
    /// An answer the protocol rules out (a failed call with code `OK`).
    Bug,
}

/// Why a configured node refused an `ApplyConfiguration` (talos-facts §11.1, §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyRefusal {
    /// `InvalidArgument`: the config fails to load or validate (§11.1 steps 5, 6 and 8), or,
    /// on Talos ≤ 1.13 with mode `NO_REBOOT`, the change cannot be applied immediately
    /// (§11.1 step 9, `CanApplyImmediate`). Talos answers both with this one code; a `STAGED`
    /// apply of the same config tells them apart, since it is validated (step 8) but never
    /// checked for immediacy. Talos 1.14 applies every change live (§5, §8.2).
    NotLive,
    /// `FailedPrecondition`: another apply is in progress, or (1.13) an earlier apply is
    /// rebooting the node (§11.1 steps 2 and 3). Retry later.
    Busy,
    /// `Unimplemented`: the node does not serve this (agent mode, or mode `REBOOT` on a 1.14
    /// configured node; §11.1 steps 1 and 7).
    Unsupported,
    /// The call did not get a refusal from the node: no connection, a timeout, another code.
    NotAnswered,
}

impl TalosError {
    /// What kind of fault this is.
    pub fn category(&self) -> Category {
        match self {
            Self::FingerprintMismatch { .. } | Self::InvalidEndpoint { .. } => Category::UserFix,
            Self::Connect { .. }
            | Self::ConnectTimeout { .. }
            | Self::Timeout { .. }
            | Self::Node { .. } => Category::Transient,
            Self::Rpc { status, .. } => code_category(status.code()),
        }
    }

    /// Why an `ApplyConfiguration` call to a configured node was refused.
    pub fn apply_refusal(&self) -> ApplyRefusal {
        match self.code() {
            Some(Code::InvalidArgument) => ApplyRefusal::NotLive,
            Some(Code::FailedPrecondition) => ApplyRefusal::Busy,
            Some(Code::Unimplemented) => ApplyRefusal::Unsupported,
            _ => ApplyRefusal::NotAnswered,
        }
    }
}

/// The category of a failed call's gRPC code.
fn code_category(code: Code) -> Category {
    match code {
        // The request itself or the caller's rights: the same call fails the same way.
        Code::InvalidArgument
        | Code::OutOfRange
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::Unimplemented => Category::UserFix,
        // The node's state or the network (FailedPrecondition covers "not ready yet", e.g.
        // bootstrap before CRI is up and a concurrent apply: talos-facts §5).
        Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::NotFound
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss => Category::Transient,
        Code::Ok => Category::Bug,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(code: Code) -> TalosError {
        TalosError::Rpc {
            method: "ApplyConfiguration",
            endpoint: "10.0.0.1:50000".into(),
            status: tonic::Status::new(code, "any text: decisions never read it"),
        }
    }

    #[test]
    fn apply_refusals_follow_the_grpc_code() {
        assert_eq!(
            rpc(Code::InvalidArgument).apply_refusal(),
            ApplyRefusal::NotLive
        );
        assert_eq!(
            rpc(Code::FailedPrecondition).apply_refusal(),
            ApplyRefusal::Busy
        );
        assert_eq!(
            rpc(Code::Unimplemented).apply_refusal(),
            ApplyRefusal::Unsupported
        );
        assert_eq!(
            rpc(Code::Unavailable).apply_refusal(),
            ApplyRefusal::NotAnswered
        );
        let timeout = TalosError::ConnectTimeout {
            endpoint: "10.0.0.1".into(),
            seconds: 10,
        };
        assert_eq!(timeout.apply_refusal(), ApplyRefusal::NotAnswered);
    }

    #[test]
    fn categories_separate_fixes_from_retries() {
        let mismatch = TalosError::FingerprintMismatch {
            endpoint: "10.0.0.1".into(),
            pinned: "a".into(),
            observed: "b".into(),
        };
        assert_eq!(mismatch.category(), Category::UserFix);
        assert_eq!(rpc(Code::InvalidArgument).category(), Category::UserFix);
        assert_eq!(rpc(Code::PermissionDenied).category(), Category::UserFix);
        assert_eq!(
            rpc(Code::FailedPrecondition).category(),
            Category::Transient
        );
        assert_eq!(rpc(Code::Unavailable).category(), Category::Transient);
        assert_eq!(rpc(Code::DeadlineExceeded).category(), Category::Transient);
        assert_eq!(rpc(Code::Ok).category(), Category::Bug);
        let node = TalosError::Node {
            method: "Reset",
            endpoint: "10.0.0.1".into(),
            message: "busy".into(),
        };
        assert_eq!(node.category(), Category::Transient);
    }
}
