//! The local demo, non-interactively: `ichor-demo --until-ready` brings a cluster to Ready and
//! exits cleanly.

#[test]
fn the_demo_reaches_ready_and_exits() {
    let out = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-demo"))
        .args(["--until-ready", "--net", "73", "--out"])
        .arg(out.path())
        .output()
        .expect("run ichor-demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("TalosCluster demo is Ready"), "{stdout}");
    assert!(stdout.contains("Discovered, all pending"), "{stdout}");
}
