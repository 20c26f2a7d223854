//! What a user must see when a reconcile stops short: a [`Stop`], a condition reason and a
//! message, turned into a condition and an Event here and nowhere else.
//!
//! A stop is not an [`Error`](crate::Error): an error ends the reconcile and its
//! [`Category`](crate::Category) decides the retry; a stop is a wait or a refusal the
//! reconcile records on the object and then goes on or requeues. A step that can stop and can
//! fail returns `Result<Result<T, Stop>, Error>`: the outer error for the error policy, the
//! inner stop for the user. Why a machine, a cluster, a backup or an operation stopped is
//! always one `Stop`; its reason is a constant of `ichor_api::names::reasons`, listed with
//! what to do in `docs/troubleshooting.md`.

use ichor_api::common::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::events::EventType;

use crate::Context;
use crate::infra::conditions as cond;

/// Why a reconcile stopped short, as the user sees it: a condition's reason and message, and
/// the Event's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    /// The condition's and the Event's reason (a constant of `ichor_api::names::reasons`).
    pub reason: &'static str,
    /// What happened and what to do: the condition's message and the Event's note.
    pub message: String,
}

impl Stop {
    /// A stop for `reason`, saying `message`.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// Sets condition `type_` in `conditions` false with this stop's reason and message.
    pub fn set_condition(
        &self,
        conditions: &mut Vec<Condition>,
        type_: &str,
        generation: Option<i64>,
        now: &Time,
    ) {
        cond::set(
            conditions,
            type_,
            false,
            self.reason,
            self.message.clone(),
            generation,
            now,
        );
    }

    /// Publishes this stop as a Warning Event about `object`, for `action` (a constant of
    /// `ichor_api::names::actions`): something a person should look at.
    pub async fn warn<K>(&self, ctx: &Context, object: &K, action: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(ctx, object, EventType::Warning, action).await;
    }

    /// Publishes this stop as a Normal Event about `object`, for `action`: a wait that ends by
    /// itself (an operation waiting for its node, or for the cluster lock).
    pub async fn note<K>(&self, ctx: &Context, object: &K, action: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(ctx, object, EventType::Normal, action).await;
    }

    async fn publish<K>(&self, ctx: &Context, object: &K, type_: EventType, action: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        ctx.event(object, type_, self.reason, action, self.message.clone())
            .await;
    }
}

/// A bundle that is not there or not valid, as the user sees it.
impl From<crate::secrets::BundleUnavailable> for Stop {
    fn from(problem: crate::secrets::BundleUnavailable) -> Self {
        Self::new(problem.reason(), problem.to_string())
    }
}
