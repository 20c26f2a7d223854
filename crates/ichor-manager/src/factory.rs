//! The Image Factory's schematic API, as the manager uses it: a schematic is registered with
//! the factory (`POST /schematics`, talos-facts §9.3) before an installer built from it is
//! installed or upgraded to, and the ID the factory answers must be the one Ichor computed
//! (ADR 0067). Each factory and ID is registered once per manager process.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use ichor_api::names::reasons;
use ichor_api::schematic::{ImageFactorySpec, Schematic};

use crate::Stop;

/// How long a call to the factory may take.
const TIMEOUT: Duration = Duration::from_secs(15);

/// The largest answer read from the factory.
const MAX_ANSWER: usize = 64 * 1024;

/// The schematics this manager registered, by factory URL and ID.
#[derive(Debug, Default)]
pub struct Registered(Mutex<HashSet<(String, String)>>);

impl Registered {
    fn has(&self, key: &(String, String)) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(key)
    }

    fn add(&self, key: (String, String)) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key);
    }
}

/// What the factory answered a `POST /schematics` with (talos-facts §9.3).
#[derive(Debug, serde::Deserialize)]
struct Created {
    id: String,
}

/// Registers `schematic` (whose ID Ichor computed as `id`) with `factory`, once per manager.
/// `Err` says why it is not usable: the factory refused it, did not answer, or answered
/// another ID.
pub async fn register(
    registered: &Registered,
    factory: &ImageFactorySpec,
    schematic: &Schematic,
    id: &str,
) -> Result<(), Stop> {
    let key = (factory.url.trim_end_matches('/').to_owned(), id.to_owned());
    if registered.has(&key) {
        return Ok(());
    }
    let yaml = ichor_render::schematic::canonical_yaml(schematic)
        .map_err(|e| Stop::new(reasons::SCHEMATIC_NOT_REGISTERED, e.to_string()))?;
    let url = format!("{}/schematics", key.0);
    let unreachable = |detail: String| {
        Stop::new(
            reasons::SCHEMATIC_NOT_REGISTERED,
            format!(
                "the Image Factory at {} (spec.imageFactory.url) did not take schematic {id}: {detail}; retried",
                key.0
            ),
        )
    };
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .build()
        .map_err(|e| unreachable(e.to_string()))?;
    let answer = client
        .post(&url)
        .header("content-type", "application/yaml")
        .body(yaml)
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = answer.status();
    let body = answer
        .bytes()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ANSWER)]).into_owned();
    if !status.is_success() {
        return Err(unreachable(format!("{status}: {}", text.trim())));
    }
    let created: Created = serde_json::from_str(&text)
        .map_err(|e| unreachable(format!("its answer does not read ({e}): {}", text.trim())))?;
    if created.id != id {
        return Err(Stop::new(
            reasons::SCHEMATIC_ID_MISMATCH,
            format!(
                "the Image Factory at {} names the schematic {}, Ichor computed {id}: the installer would not be the declared one, so it is not used; report this with the schematic",
                key.0, created.id
            ),
        ));
    }
    registered.add(key);
    Ok(())
}
