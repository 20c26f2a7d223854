//! A small typed client for the Redfish service of a machine's BMC (DMTF DSP0266): list and read
//! computer systems, reset them, set a one-time boot override, and insert or eject a CD image
//! as virtual media. It knows nothing of Kubernetes.
//!
//! # Quick start
//!
//! ```no_run
//! use ichor_redfish::{Bmc, BootEnabled, BootTarget, Credentials, Endpoint, ResetType, Trust};
//!
//! # async fn example(ca_pem: String) -> Result<(), ichor_redfish::Error> {
//! let endpoint = Endpoint::new(
//!     "https://10.0.0.5",
//!     Credentials::new("admin", "password"),
//!     Trust::CaBundle(ca_pem),
//! );
//! let bmc = Bmc::new(endpoint)?;
//! let systems = bmc.systems().await?;
//! let system = &systems[0];
//! let cd = bmc.find_optical_media(system).await?;
//! bmc.insert_media(&cd.odata_id, "http://10.0.0.1/talos.iso").await?;
//! bmc.set_boot_override(system, BootTarget::Cd, BootEnabled::Once).await?;
//! bmc.reset(system, ResetType::On).await?;
//! println!("{:?}", bmc.system(system).await?.power_state);
//! # Ok(())
//! # }
//! ```
//!
//! # Each BMC is a failure domain of its own
//!
//! A [`Bmc`] has its own HTTP client, its own connect and call time limits, a bound on the
//! size of an answer, and a bound on the requests in flight to it ([`Limits`]): a slow or broken
//! BMC holds up only the calls to itself. A call never waits longer than
//! [`Limits::request_timeout`], its wait for a place among the requests in flight included.
//!
//! # Trust and credentials
//!
//! The endpoint is `https`, trusted by a CA bundle or by the explicit
//! [`Trust::InsecureSkipVerify`]; `http` needs [`Endpoint::allow_plain_http`]. Credentials go
//! in an HTTP Basic `Authorization` header on each request, never in a URL, and never in
//! `Debug` output, errors or logs. Every path requested comes from the service's own links and
//! must stay on the endpoint's origin; redirects are followed only there.
//!
//! # Errors
//!
//! [`Error`] sorts each failure into a cause a person acts on (wrong credentials, unreachable,
//! untrusted certificate, not found, refused with the BMC's messages, a server error, an answer
//! not shaped as Redfish naming the field, too large, not offered); [`Error::reason`] is a
//! stable word for a condition. No input from a BMC makes the client panic.
//!
//! # Matching a system to a Talos node
//!
//! [`smbios_uuid_matches`] tells whether a system's `UUID` and the SMBIOS UUID Talos reports
//! name one machine, in either byte order of the UUID's first three fields.
//!
//! # What it does not do
//!
//! It does not follow Redfish tasks (an action answered `202 Accepted` is taken as accepted),
//! open Redfish sessions (Basic authentication only), or speak OEM extensions.
#![forbid(unsafe_code)]
#![warn(clippy::pedantic)]

mod bmc;
mod endpoint;
mod error;
mod model;
mod transport;
mod uuid;

pub use bmc::Bmc;
pub use endpoint::{Credentials, Endpoint, Limits, Trust};
pub use error::Error;
pub use model::{
    Boot, BootEnabled, BootTarget, Health, PowerState, ResetAction, ResetType, System, VirtualMedia,
};
pub use uuid::smbios_uuid_matches;
