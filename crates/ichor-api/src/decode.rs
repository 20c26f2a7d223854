//! Decoding the object of an admission review into Ichor's kinds, as the webhook's guard does:
//! each kind is built from the object's metadata, without its managed fields, and its `spec`
//! and `status` as they were parsed, without a round trip through JSON.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;

use crate::{TalosCluster, TalosMachine, TalosOperation};

/// A kind decoded from a [`DynamicObject`]'s metadata and its `spec` and `status`.
pub trait Decoded: Sized {
    /// The object of this kind made of `metadata` and the remaining fields, `data`.
    fn decoded(metadata: ObjectMeta, data: &serde_json::Value) -> Result<Self, serde_json::Error>;
}

macro_rules! decoded {
    ($($kind:ty),*) => {$(
        impl Decoded for $kind {
            fn decoded(
                metadata: ObjectMeta,
                data: &serde_json::Value,
            ) -> Result<Self, serde_json::Error> {
                let spec = serde::Deserialize::deserialize(&data["spec"])?;
                let status = match data.get("status") {
                    Some(status) => serde::Deserialize::deserialize(status)?,
                    None => None,
                };
                Ok(Self {
                    metadata,
                    spec,
                    status,
                })
            }
        }
    )*};
}

decoded!(TalosMachine, TalosCluster, TalosOperation);

/// `object` as a `T`: its metadata without managed fields (nothing that decides on it reads
/// them), its `spec` and its `status`; an error when they are not what the kind says.
pub fn decode<T: Decoded>(object: DynamicObject) -> Result<T, serde_json::Error> {
    let DynamicObject {
        mut metadata, data, ..
    } = object;
    metadata.managed_fields = None;
    T::decoded(metadata, &data)
}
