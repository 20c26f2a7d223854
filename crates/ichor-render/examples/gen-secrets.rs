//! Prints a new secrets bundle, like `talosctl gen secrets`: `gen-secrets [v1.13.0|v1.14.0]`.

use std::process::ExitCode;

use ichor_render::{Contract, SecretsBundle};

fn main() -> ExitCode {
    let version = std::env::args().nth(1).unwrap_or_else(|| "v1.14.0".into());
    let result = Contract::from_version(&version)
        .map_err(|e| e.to_string())
        .and_then(|c| SecretsBundle::generate(c).map_err(|e| e.to_string()))
        .and_then(|b| b.to_yaml().map_err(|e| e.to_string()));
    match result {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("gen-secrets: {err}");
            ExitCode::FAILURE
        }
    }
}
