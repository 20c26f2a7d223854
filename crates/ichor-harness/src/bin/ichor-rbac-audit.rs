//! `ichor-rbac-audit DIR`: reads the audit logs a sim e2e run left in `DIR` and fails when a
//! shipped role grants a permission Ichor never used, or when Ichor asked for something and was
//! refused. `cargo xtask test` runs it after the tests.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ichor_harness::audit;

/// Checks the shipped roles against what a run's audit logs show Ichor used.
#[derive(Debug, Parser)]
struct Options {
    /// The folder of the run's audit logs (`*.log`).
    dir: PathBuf,
}

fn main() -> ExitCode {
    let dir = Options::parse().dir;
    let mut requests = Vec::new();
    let mut files = 0;
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    files += 1;
                    // Every refusal counts, a restarted apiserver's too: the sim target lets
                    // the binaries reach an apiserver only once its authorizer grants the
                    // shipped roles (`ichor_harness::sim::wait_granted`).
                    match std::fs::read_to_string(&path) {
                        Ok(text) => requests.extend(audit::requests(&text)),
                        Err(e) => {
                            eprintln!("ichor-rbac-audit: cannot read {}: {e}", path.display());
                            return ExitCode::FAILURE;
                        }
                    }
                }
            }
        }
        Err(e) => {
            eprintln!("ichor-rbac-audit: cannot read {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    println!(
        "rbac audit: {files} audit logs, {} requests",
        requests.len()
    );
    let mut failed = false;
    for (user, grants) in audit::shipped() {
        let findings = audit::audit(&user, &grants, &requests);
        println!(
            "{user}: {} requests, {} grants, {} unused, {} refused",
            findings.requests,
            grants.len(),
            findings.unused.len(),
            findings.refused.len()
        );
        if findings.requests == 0 {
            println!("  no request of {user} was audited: the run did not exercise it");
            failed = true;
        }
        for permission in &findings.unused {
            println!("  granted but never used: {permission}");
            failed = true;
        }
        for permission in &findings.refused {
            println!("  asked for and refused: {permission}");
            failed = true;
        }
    }
    if failed {
        println!(
            "rbac audit: FAILED (remove the unused grants from crates/ichor-api/src/admission.rs and run `cargo xtask crdgen`, or add the permission the code needs)"
        );
        ExitCode::FAILURE
    } else {
        println!("rbac audit: every grant is used and nothing was refused");
        ExitCode::SUCCESS
    }
}
