//! The golden corpus: {1.13, 1.14} × {controlplane, worker} × {flannel, cilium without
//! kube-proxy, none} × {no patches, a patch set}. Every file matches what the renderer produces
//! and passes Talos's own strict validation (through the oracle of its contract).
//!
//! After an intended change, regenerate with `ICHOR_UPDATE_GOLDEN=1 cargo test -p ichor-render
//! --test golden` and review the diff.

mod support;

use support::{Case, cases, golden_dir, render_case, run_oracle};

fn golden_path(case: &Case) -> std::path::PathBuf {
    golden_dir().join(format!("{}.yaml", case.name))
}

#[test]
fn golden_configs_match_what_the_renderer_produces() {
    let update = std::env::var_os("ICHOR_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for case in cases() {
        let rendered = render_case(&case);
        let path = golden_path(&case);
        if update {
            std::fs::write(&path, &rendered.yaml).expect("write golden file");
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != rendered.yaml {
            stale.push(case.name);
        }
    }
    assert!(
        stale.is_empty(),
        "golden files differ from the renderer: {stale:?}; if intended, run ICHOR_UPDATE_GOLDEN=1 cargo test -p ichor-render --test golden and review the diff"
    );
}

#[test]
fn every_golden_config_passes_talos_strict_validation() {
    let mut failures = Vec::new();
    for case in cases() {
        let yaml = std::fs::read(golden_path(&case)).expect("golden file exists");
        let (ok, out) = run_oracle(case.contract, &["validate"], &yaml);
        if !ok {
            failures.push(format!("{}: {out}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "Talos refuses:\n{}",
        failures.join("\n")
    );
}

#[test]
fn rendering_is_deterministic() {
    for case in cases() {
        let first = render_case(&case);
        let second = render_case(&case);
        assert_eq!(first.yaml, second.yaml, "{}", case.name);
        assert_eq!(first.hash, second.hash, "{}", case.name);
        assert!(first.hash.starts_with("sha256:") && first.hash.len() == 71);
    }
}
