//! Safety rails for the targets that touch real clusters. Each rail is enforced here, in code,
//! before any call is made:
//!
//! - the outer cluster is reached only through an explicit context that must exist in the
//!   kubeconfig (`KUBECONFIG` and `ICHOR_E2E_KUBE_CONTEXT` both set; never a current-context);
//! - deletes on the outer cluster name their object and the `ichor-e2e` namespace (no
//!   collections, no selectors, nothing cluster-scoped);
//! - the inner (management) cluster's handle has no delete at all;
//! - a Talos call needs an explicit target node, and protected addresses (the outer cluster's
//!   own nodes) are refused as targets;
//! - child processes get a cleared environment plus an allow-list.

use std::ffi::OsString;
use std::net::IpAddr;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Resource, ResourceExt as _};

/// The only namespace the e2e targets touch on the outer cluster. Its objects have fixed
/// names: one run at a time per outer cluster.
pub const E2E_NAMESPACE: &str = "ichor-e2e";
/// The variable naming the outer cluster's kubeconfig context.
pub const CONTEXT_ENV: &str = "ICHOR_E2E_KUBE_CONTEXT";
/// The variable naming the outer cluster's kubeconfig file.
pub const KUBECONFIG_ENV: &str = "KUBECONFIG";
/// The variable listing protected addresses (comma-separated), never a Talos target.
pub const PROTECTED_ENV: &str = "ICHOR_E2E_PROTECTED_ADDRESSES";
/// The largest environment a child process may get.
pub const CHILD_ENV_LIMIT: usize = 16 * 1024;
/// What a child process may inherit.
pub const CHILD_ENV_ALLOW: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "TMPDIR",
    KUBECONFIG_ENV,
    CONTEXT_ENV,
    PROTECTED_ENV,
    "RUST_LOG",
    "RUST_BACKTRACE",
];

/// A rail refused something.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RailError {
    /// A required variable is not set.
    #[error("{0} is not set: the e2e targets never fall back to a default kubeconfig or context")]
    Unset(&'static str),
    /// The kubeconfig cannot be read.
    #[error("the kubeconfig {path} cannot be read: {detail}")]
    Kubeconfig {
        /// Its path.
        path: String,
        /// Why.
        detail: String,
    },
    /// The pinned context is not in the kubeconfig.
    #[error("context {context:?} is not in the kubeconfig {path} (contexts there: {known})")]
    UnknownContext {
        /// The context asked for.
        context: String,
        /// The kubeconfig.
        path: String,
        /// The contexts it has.
        known: String,
    },
    /// A delete that does not name one namespaced object in `ichor-e2e`.
    #[error(
        "refused delete of {kind} {name:?} in namespace {namespace:?}: outer-cluster deletes must name one object in namespace {E2E_NAMESPACE}"
    )]
    Delete {
        /// The kind.
        kind: String,
        /// The name given.
        name: String,
        /// The namespace given.
        namespace: String,
    },
    /// A Talos call without a target node.
    #[error("a Talos call needs an explicit target node")]
    NoNode,
    /// A Talos call to a protected address.
    #[error("{0} is protected (an outer-cluster node): it is never a Talos target")]
    Protected(String),
    /// A Talos target that is not an address.
    #[error("Talos target {0:?} is not an IP address")]
    NotAnAddress(String),
    /// The child's environment would be too large.
    #[error(
        "a child process's environment would be {0} bytes, over the {CHILD_ENV_LIMIT}-byte limit"
    )]
    ChildEnvironment(usize),
}

/// The outer cluster's kubeconfig and pinned context, checked before any call.
#[derive(Debug, Clone)]
pub struct Pinned {
    /// The kubeconfig path.
    pub path: String,
    /// The context every call uses.
    pub context: String,
    kubeconfig: Kubeconfig,
}

impl Pinned {
    /// Reads `KUBECONFIG` and `ICHOR_E2E_KUBE_CONTEXT` through `var`; refuses when either is
    /// unset or the context is not in the kubeconfig.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, RailError> {
        let path = var(KUBECONFIG_ENV)
            .filter(|v| !v.is_empty())
            .ok_or(RailError::Unset(KUBECONFIG_ENV))?;
        let context = var(CONTEXT_ENV)
            .filter(|v| !v.is_empty())
            .ok_or(RailError::Unset(CONTEXT_ENV))?;
        Self::new(&path, &context)
    }

    /// Pins `context` of the kubeconfig at `path` (one file; no merging).
    pub fn new(path: &str, context: &str) -> Result<Self, RailError> {
        let unreadable = |detail: String| RailError::Kubeconfig {
            path: path.to_owned(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?;
        let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|e| unreadable(e.to_string()))?;
        if !kubeconfig.contexts.iter().any(|c| c.name == context) {
            return Err(RailError::UnknownContext {
                context: context.to_owned(),
                path: path.to_owned(),
                known: kubeconfig
                    .contexts
                    .iter()
                    .map(|c| c.name.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            context: context.to_owned(),
            kubeconfig,
        })
    }

    /// A client bound to the pinned context (never the current-context).
    pub async fn client(&self) -> Result<kube::Client, crate::Error> {
        let options = KubeConfigOptions {
            context: Some(self.context.clone()),
            ..Default::default()
        };
        let config = kube::Config::from_custom_kubeconfig(self.kubeconfig.clone(), &options)
            .await
            .map_err(|e| crate::Error::Spec(format!("kubeconfig: {e}")))?;
        Ok(kube::Client::try_from(config)?)
    }
}

/// The outer cluster: creates and reads anything in `ichor-e2e`, deletes only named objects
/// there.
#[derive(Clone)]
pub struct Outer {
    client: kube::Client,
}

impl Outer {
    /// The outer cluster through its pinned context.
    pub async fn connect(pinned: &Pinned) -> Result<Self, crate::Error> {
        Ok(Self {
            client: pinned.client().await?,
        })
    }

    /// Namespaced objects of kind `K` in `ichor-e2e`.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), E2E_NAMESPACE)
    }

    /// Deletes the object `name` of kind `K` in `namespace`, which must be `ichor-e2e`.
    pub async fn delete<K>(&self, namespace: &str, name: &str) -> Result<(), crate::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        check_delete(&K::kind(&()), namespace, name).map_err(rail)?;
        match Api::<K>::namespaced(self.client.clone(), namespace)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Outer {
    /// Objects of a kind the outer cluster may or may not serve (KubeVirt's, CDI's), in
    /// `ichor-e2e`.
    pub fn dynamic(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), E2E_NAMESPACE, resource)
    }

    /// Deletes the object `name` of the dynamic kind `resource` in `namespace`, which must be
    /// `ichor-e2e`.
    pub async fn delete_dynamic(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Result<(), crate::Error> {
        check_delete(&resource.kind, namespace, name).map_err(rail)?;
        match Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, resource)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the outer cluster serves `api_version` (e.g. `kubevirt.io/v1`).
    pub async fn serves(&self, api_version: &str) -> Result<bool, crate::Error> {
        match self.client.list_api_group_resources(api_version).await {
            Ok(_) => Ok(true),
            // A group the apiserver does not serve answers a plain-text "404 page not found",
            // not a Status with reason NotFound: the code is all there is to read.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the namespace `ichor-e2e` exists (it is never created or deleted here).
    pub async fn namespace_exists(&self) -> Result<bool, crate::Error> {
        Ok(
            Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone())
                .get_opt(E2E_NAMESPACE)
                .await?
                .is_some(),
        )
    }

    /// The outer cluster's Nodes (read only).
    pub async fn nodes(&self) -> Result<Vec<k8s_openapi::api::core::v1::Node>, crate::Error> {
        Ok(
            Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
                .list(&Default::default())
                .await?
                .items,
        )
    }
}

/// The inner (management) cluster: the specs create, read and patch there; this handle has no
/// delete.
#[derive(Clone)]
pub struct Inner {
    client: kube::Client,
}

impl Inner {
    /// Wraps the inner cluster's client.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// A namespaced API for create, get, list and patch (deletes go through the specs'
    /// named removal flows, never through this handle).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }
}

fn rail(error: RailError) -> crate::Error {
    crate::Error::Spec(error.to_string())
}

/// A delete on the outer cluster must name one object in `ichor-e2e`.
pub fn check_delete(kind: &str, namespace: &str, name: &str) -> Result<(), RailError> {
    let valid_name = !name.is_empty() && !name.contains('*') && !name.contains(',');
    if namespace != E2E_NAMESPACE || !valid_name {
        return Err(RailError::Delete {
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        });
    }
    Ok(())
}

/// Protected addresses: never a Talos target.
#[derive(Debug, Clone, Default)]
pub struct Protected(Vec<IpAddr>);

impl Protected {
    /// Parses a comma-separated list of IP addresses.
    pub fn parse(list: &str) -> Result<Self, RailError> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpAddr>()
                    .map_err(|_| RailError::NotAnAddress(s.to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// Both lists.
    pub fn union(&self, other: &Self) -> Self {
        let mut all = self.0.clone();
        all.extend(other.0.iter().filter(|a| !self.0.contains(a)));
        Self(all)
    }

    /// The node a Talos call targets: refused when missing, not an address, or protected.
    pub fn talos_target(&self, node: Option<&str>) -> Result<IpAddr, RailError> {
        let node = node
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or(RailError::NoNode)?;
        let host = node
            .parse::<std::net::SocketAddr>()
            .map(|s| s.ip())
            .or_else(|_| node.parse::<IpAddr>())
            .map_err(|_| RailError::NotAnAddress(node.to_owned()))?;
        if self.0.contains(&host) {
            return Err(RailError::Protected(host.to_string()));
        }
        Ok(host)
    }
}

/// The environment a child process gets: only the allowed variables of `parent`, refused when
/// it would exceed [`CHILD_ENV_LIMIT`].
pub fn child_env(
    parent: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Vec<(OsString, OsString)>, RailError> {
    let kept: Vec<(OsString, OsString)> = parent
        .into_iter()
        .filter(|(k, _)| CHILD_ENV_ALLOW.iter().any(|a| k.as_os_str() == *a))
        .collect();
    let size: usize = kept.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if size > CHILD_ENV_LIMIT {
        return Err(RailError::ChildEnvironment(size));
    }
    Ok(kept)
}

/// A command with a cleared environment plus the allowed variables of this process.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Result<std::process::Command, RailError> {
    let mut command = std::process::Command::new(program);
    command.env_clear().envs(child_env(std::env::vars_os())?);
    Ok(command)
}

/// The name of an object, for messages.
pub fn describe<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!("{} {}", K::kind(&()), object.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_must_name_one_object_in_the_e2e_namespace() {
        assert!(check_delete("Pod", E2E_NAMESPACE, "talos-1").is_ok());
        assert!(check_delete("Pod", E2E_NAMESPACE, "").is_err());
        assert!(check_delete("Pod", "default", "talos-1").is_err());
        assert!(check_delete("Pod", "", "talos-1").is_err());
        assert!(check_delete("Pod", E2E_NAMESPACE, "*").is_err());
    }

    #[test]
    fn talos_targets_are_explicit_and_never_protected() {
        let protected = Protected::parse("10.0.0.1, 10.0.0.2").expect("list");
        assert_eq!(protected.talos_target(None), Err(RailError::NoNode));
        assert_eq!(protected.talos_target(Some(" ")), Err(RailError::NoNode));
        assert_eq!(
            protected.talos_target(Some("10.0.0.2")),
            Err(RailError::Protected("10.0.0.2".into()))
        );
        assert_eq!(
            protected.talos_target(Some("10.0.0.1:50000")),
            Err(RailError::Protected("10.0.0.1".into()))
        );
        assert!(protected.talos_target(Some("10.0.0.3")).is_ok());
        assert!(matches!(
            protected.talos_target(Some("node-a")),
            Err(RailError::NotAnAddress(_))
        ));
        assert!(Protected::parse("10.0.0.1,not-an-ip").is_err());
    }

    #[test]
    fn children_get_only_the_allowed_variables() {
        let parent = vec![
            (OsString::from("PATH"), OsString::from("/usr/bin")),
            (
                OsString::from("HUGE"),
                OsString::from("x".repeat(200 * 1024)),
            ),
            (OsString::from("SECRET_TOKEN"), OsString::from("s3cr3t")),
        ];
        let env = child_env(parent).expect("small");
        assert_eq!(
            env,
            vec![(OsString::from("PATH"), OsString::from("/usr/bin"))]
        );
        let too_big = vec![(
            OsString::from("PATH"),
            OsString::from("x".repeat(20 * 1024)),
        )];
        assert!(matches!(
            child_env(too_big),
            Err(RailError::ChildEnvironment(_))
        ));
    }

    #[test]
    fn missing_variables_are_refused_without_a_fallback() {
        assert_eq!(
            Pinned::from_env(|_| None).err(),
            Some(RailError::Unset(KUBECONFIG_ENV))
        );
        assert_eq!(
            Pinned::from_env(|k| (k == KUBECONFIG_ENV).then(|| "/nonexistent".into())).err(),
            Some(RailError::Unset(CONTEXT_ENV))
        );
    }
}
