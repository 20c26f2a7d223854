//! The discovery sweep: every address of up to four IPv4 CIDRs (each no larger than a /24) is
//! probed on port 50000 with bounded concurrency and a connect/handshake timeout. A node in
//! maintenance mode is read (fingerprint, version, inventory); everything else is classified,
//! not treated as an error. Nothing is ever written to a node.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

use crate::client::{TalosClient, TalosError};
use crate::resources::Inventory;
use crate::tls::PinningVerifier;

/// At most this many CIDRs per sweep.
pub const MAX_CIDRS: usize = 4;
/// The largest range a CIDR may cover (/24).
pub const MIN_PREFIX: u8 = 24;

/// A sweep that cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SweepError {
    /// Too many CIDRs.
    #[error("at most {MAX_CIDRS} discovery CIDRs are allowed, got {0}")]
    TooManyCidrs(usize),
    /// A CIDR does not parse or is not IPv4.
    #[error("discovery CIDR {0:?} is not an IPv4 CIDR like 192.168.10.0/24")]
    InvalidCidr(String),
    /// A CIDR is larger than a /24.
    #[error("discovery CIDR {0:?} is larger than a /{MIN_PREFIX}")]
    TooLarge(String),
}

/// How a sweep probes.
#[derive(Debug, Clone, Copy)]
pub struct SweepConfig {
    /// The port probed (Talos's API port).
    pub port: u16,
    /// Probes in flight at once.
    pub concurrency: usize,
    /// Limit for the TCP connect, for the TLS handshake, and for each read.
    pub timeout: Duration,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            port: crate::TALOS_API_PORT,
            concurrency: 64,
            timeout: Duration::from_secs(2),
        }
    }
}

/// A node found in maintenance mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its address.
    pub address: Ipv4Addr,
    /// The fingerprint of its certificate (pin this).
    pub fingerprint: String,
    /// Its Talos version.
    pub version: String,
    /// Its hardware.
    pub inventory: Inventory,
}

/// What answered at an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// A Talos node in maintenance mode.
    Maintenance(Box<Found>),
    /// A configured Talos node: it speaks TLS but wants a client certificate.
    Configured {
        /// The fingerprint of its certificate.
        fingerprint: String,
    },
    /// A TLS server that is not a Talos API.
    NotTalos {
        /// What went wrong talking Talos to it.
        detail: String,
    },
    /// Something accepted TCP but never completed a TLS handshake.
    NoTls,
}

/// One address where something answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The address.
    pub address: Ipv4Addr,
    /// What answered.
    pub outcome: ProbeOutcome,
}

/// Every host address of the CIDRs, in order (network and broadcast addresses excluded for
/// prefixes shorter than /31).
pub fn addresses(cidrs: &[String]) -> Result<Vec<Ipv4Addr>, SweepError> {
    if cidrs.len() > MAX_CIDRS {
        return Err(SweepError::TooManyCidrs(cidrs.len()));
    }
    let mut out = Vec::new();
    for cidr in cidrs {
        let invalid = || SweepError::InvalidCidr(cidr.clone());
        let (ip, prefix) = cidr.split_once('/').ok_or_else(invalid)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        if prefix > 32 {
            return Err(invalid());
        }
        if prefix < MIN_PREFIX {
            return Err(SweepError::TooLarge(cidr.clone()));
        }
        let size = 1u32 << (32 - u32::from(prefix));
        let network = u32::from(ip) & !(size - 1);
        let (first, last) = if size > 2 { (1, size - 1) } else { (0, size) };
        out.extend((first..last).map(|i| Ipv4Addr::from(network + i)));
    }
    out.dedup();
    Ok(out)
}

/// Sweeps the CIDRs and returns every address where something answered, in address order.
///
/// ```
/// use ichor_talos::discovery::{ProbeOutcome, SweepConfig, sweep};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = ichor_sim::SimNode::start("127.0.0.1:0".parse()?, "v1.14.1").await?;
/// // Real nodes listen on 50000 (the default); the simulated one took a free port.
/// let config = SweepConfig {
///     port: node.addr().port(),
///     ..SweepConfig::default()
/// };
/// let found = sweep(&["127.0.0.1/32".to_owned()], config).await?;
/// let [probe] = found.as_slice() else {
///     panic!("one node: {found:?}")
/// };
/// let ProbeOutcome::Maintenance(seen) = &probe.outcome else {
///     panic!("a maintenance-mode node: {probe:?}")
/// };
/// // What a person checks (against the console) and pins; nothing was written to the node.
/// assert_eq!(seen.fingerprint, node.fingerprint());
/// assert_eq!(seen.version, "v1.14.1");
/// assert_eq!(seen.inventory.uuid, node.hardware().uuid);
/// node.stop().await;
/// # Ok(())
/// # }
/// ```
pub async fn sweep(cidrs: &[String], config: SweepConfig) -> Result<Vec<Probe>, SweepError> {
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    sweep_sharing(cidrs, config, &permits).await
}

/// Sweeps as [`sweep`] does, each probe holding one of `permits`, a pool other sweeps may
/// share (`config.concurrency` is not read): however many sweeps run at once, no more probes
/// are in flight than the pool holds. A probe holds a TCP connection, a TLS session and an
/// HTTP/2 connection's buffers; sixteen sweeps of sixty-four probes each were most of a
/// manager's memory at 1000 machines (`docs/benchmarks/fleet.md`).
pub async fn sweep_sharing(
    cidrs: &[String],
    config: SweepConfig,
    permits: &Arc<Semaphore>,
) -> Result<Vec<Probe>, SweepError> {
    let addresses = addresses(cidrs)?;
    let mut tasks = JoinSet::new();
    for address in addresses {
        let permits = Arc::clone(permits);
        tasks.spawn(async move {
            let _permit = permits
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            probe(address, config)
                .await
                .map(|outcome| Probe { address, outcome })
        });
    }
    let mut found = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Ok(Some(probe)) = result {
            found.push(probe);
        }
    }
    found.sort_by_key(|p| p.address);
    Ok(found)
}

/// Probes one address: `None` when nothing accepted a TCP connection in time.
pub async fn probe(address: Ipv4Addr, config: SweepConfig) -> Option<ProbeOutcome> {
    let socket = SocketAddr::from((address, config.port));
    let tcp = tokio::time::timeout(config.timeout, TcpStream::connect(socket))
        .await
        .ok()?
        .ok()?;
    // First look: complete a TLS handshake accepting any certificate, recording its
    // fingerprint. Handshake signatures are still verified.
    let verifier = PinningVerifier::recording();
    let observed = verifier.observed();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(verifier))
    .with_no_client_auth();
    // One handshake per config: a session cache (256 entries, allocated up front) would only
    // be thrown away with it.
    tls.resumption = rustls::client::Resumption::disabled();
    let connector = TlsConnector::from(Arc::new(tls));
    let name = ServerName::try_from("talos").expect("a valid server name");
    match tokio::time::timeout(config.timeout, connector.connect(name, tcp)).await {
        Ok(Ok(_stream)) => {}
        _ => return Some(ProbeOutcome::NoTls),
    }
    let fingerprint = observed.lock().ok().and_then(|o| o.clone())?;
    // Then talk Talos to it, pinned to what it just showed.
    let endpoint = socket.to_string();
    let read = async {
        let client = TalosClient::connect_maintenance(&endpoint, &fingerprint).await?;
        let version = client.version().await?;
        let inventory = client.inventory().await?;
        Ok::<_, TalosError>((version, inventory))
    };
    match tokio::time::timeout(config.timeout * 3, read).await {
        Ok(Ok((version, inventory))) => Some(ProbeOutcome::Maintenance(Box::new(Found {
            address,
            fingerprint,
            version,
            inventory,
        }))),
        Ok(Err(error)) if wants_client_certificate(&error) => {
            Some(ProbeOutcome::Configured { fingerprint })
        }
        Ok(Err(error)) => Some(ProbeOutcome::NotTalos {
            detail: error_chain(&error),
        }),
        Err(_) => Some(ProbeOutcome::NotTalos {
            detail: "no Talos API answer in time".into(),
        }),
    }
}

/// Whether the TLS server at `address` asks for a client certificate in its handshake, which
/// tells the two modes of a Talos node apart without a race: a configured node's apid requires
/// one, a node in maintenance mode asks for none (talos-facts §2). `None` when nothing
/// completes a handshake within `timeout` (for the connect, and again for the handshake).
/// Nothing is sent past the handshake, and no certificate is offered.
pub async fn asks_for_client_certificate(address: SocketAddr, timeout: Duration) -> Option<bool> {
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .ok()?
        .ok()?;
    let asked = Arc::new(AskedForCertificate::default());
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(PinningVerifier::recording()))
    .with_client_cert_resolver(Arc::clone(&asked) as Arc<dyn rustls::client::ResolvesClientCert>);
    tls.resumption = rustls::client::Resumption::disabled();
    let name = ServerName::try_from("talos").expect("a valid server name");
    let connector = TlsConnector::from(Arc::new(tls));
    // A server that requires a certificate may end the handshake once it sees none: that is
    // an answer too, the request was seen first.
    let handshake = tokio::time::timeout(timeout, connector.connect(name, tcp)).await;
    let seen = asked.0.load(std::sync::atomic::Ordering::SeqCst);
    match handshake {
        Ok(Ok(_)) => Some(seen),
        _ => seen.then_some(true),
    }
}

/// A client "certificate resolver" that offers none and records that one was asked for.
#[derive(Debug, Default)]
struct AskedForCertificate(std::sync::atomic::AtomicBool);

impl rustls::client::ResolvesClientCert for AskedForCertificate {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        None
    }

    fn has_certs(&self) -> bool {
        // Asked, so that a server's request reaches `resolve`.
        true
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A configured node's apid refuses a client without a certificate during the handshake.
fn wants_client_certificate(error: &TalosError) -> bool {
    let text = error_chain(error).to_lowercase();
    text.contains("certificate required") || text.contains("certificaterequired")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_expand_to_host_addresses() {
        let all = addresses(&["10.0.0.0/24".into()]).expect("valid");
        assert_eq!(all.len(), 254);
        assert_eq!(all[0], Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(all[253], Ipv4Addr::new(10, 0, 0, 254));
        assert_eq!(
            addresses(&["10.0.0.7/32".into()]).expect("valid"),
            [Ipv4Addr::new(10, 0, 0, 7)]
        );
        assert_eq!(addresses(&["10.0.0.7/31".into()]).expect("valid").len(), 2);
        assert_eq!(
            addresses(&["10.0.0.9/30".into()]).expect("valid"),
            [Ipv4Addr::new(10, 0, 0, 9), Ipv4Addr::new(10, 0, 0, 10)]
        );
    }

    #[test]
    fn sweeps_refuse_what_discovery_does_not_allow() {
        assert_eq!(
            addresses(&["10.0.0.0/23".into()]),
            Err(SweepError::TooLarge("10.0.0.0/23".into()))
        );
        assert!(matches!(
            addresses(&["fd00::/120".into()]),
            Err(SweepError::InvalidCidr(_))
        ));
        assert!(matches!(
            addresses(&["10.0.0.0".into()]),
            Err(SweepError::InvalidCidr(_))
        ));
        let five: Vec<String> = (1..=5).map(|i| format!("10.0.{i}.0/24")).collect();
        assert_eq!(addresses(&five), Err(SweepError::TooManyCidrs(5)));
    }
}
