//! The Kubernetes connection, read as kubectl reads it: `--kubeconfig`, else `KUBECONFIG`,
//! else `~/.kube/config`; `--context`, else the current context; `-n`, else the context's
//! namespace, else `default`. Inside a pod with no kubeconfig, the in-cluster connection.

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::Error;
use crate::cli::Global;

/// A client and the namespace commands work in.
#[derive(Clone)]
pub struct Connection {
    /// The client.
    pub client: kube::Client,
    /// The namespace.
    pub namespace: String,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Connects as the flags and the kubeconfig say.
pub async fn connect(global: &Global) -> Result<Connection, Error> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        cluster: None,
        user: None,
    };
    let config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                Error::Kubeconfig(format!(
                    "cannot read the kubeconfig {}: {e}",
                    path.display()
                ))
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| {
                    Error::Kubeconfig(format!("cannot use the kubeconfig {}: {e}", path.display()))
                })?
        }
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(error) => {
                let in_pod = global.context.is_none()
                    && std::env::var_os("KUBECONFIG").is_none()
                    && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
                match in_pod.then(kube::Config::incluster) {
                    Some(Ok(config)) => config,
                    _ => {
                        return Err(Error::Kubeconfig(format!(
                            "cannot use the kubeconfig (KUBECONFIG, else ~/.kube/config): {error}; pass --kubeconfig FILE and --context NAME"
                        )));
                    }
                }
            }
        },
    };
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config)
        .map_err(|e| Error::Kubeconfig(format!("cannot build a Kubernetes client: {e}")))?;
    Ok(Connection { client, namespace })
}

/// How many objects one list call asks for: kubectl's own chunk size.
pub const LIST_PAGE: u32 = 500;

/// Every object of `api`, fetched in pages of [`LIST_PAGE`]: one call per 500 objects, never
/// one per object, and no single reply holding a whole large fleet. `what` names the objects
/// in the error, e.g. `TalosMachines in namespace lab`.
pub async fn list_all<K>(api: &kube::Api<K>, what: &str) -> Result<Vec<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(list_pages(api, what, LIST_PAGE).await?.0)
}

/// Every object of `api`, in pages of `page` objects; also says how many list calls it made.
pub async fn list_pages<K>(
    api: &kube::Api<K>,
    what: &str,
    page: u32,
) -> Result<(Vec<K>, usize), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut calls = 0;
    let mut params = kube::api::ListParams::default().limit(page);
    loop {
        let found = api
            .list(&params)
            .await
            .map_err(|e| Error::kube(format!("cannot list {what}"), &e))?;
        calls += 1;
        items.extend(found.items);
        match found.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((items, calls)),
        }
    }
}
