//! `cargo xtask bench [render]`: benchmarks, with the reference implementation's rate beside
//! ours where there is one. Results are printed and written under `docs/benchmarks/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::envtest;
use crate::run::run;

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Runs the named benchmarks (all when `which` is empty).
pub fn bench(root: &Path, which: &[String]) -> Result<()> {
    let all = which.is_empty();
    for name in which {
        if name != "render" {
            bail!("unknown benchmark {name:?}: the benchmarks are: render");
        }
    }
    if all || which.iter().any(|w| w == "render") {
        render(root)?;
    }
    Ok(())
}

fn render(root: &Path) -> Result<()> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root)
        .args(["bench", "-p", "ichor-render", "--bench", "render"]);
    run(cmd)?;
    let estimates = target_dir(root).join("criterion/render_controlplane_1_14/new/estimates.json");
    let estimates: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&estimates)
            .with_context(|| format!("read {}", estimates.display()))?,
    )
    .context("parse criterion's estimates")?;
    let mean_ns = estimates["mean"]["point_estimate"]
        .as_f64()
        .context("criterion's mean estimate")?;
    let ours = 1e9 / mean_ns;

    // Talos's own generator, same bundle and inputs, through the 1.14 oracle.
    let oracle = envtest::oracles(root)?.join("talos-oracle-1.14");
    let bundle =
        std::fs::read_to_string(root.join("crates/ichor-render/tests/golden/bundle-1.14.yaml"))
            .context("read the test bundle")?;
    let request = serde_json::json!({
        "bundle": bundle,
        "clusterName": "lab",
        "endpoint": "https://192.168.10.5:6443",
        "kubernetesVersion": "1.36.3",
        "role": "controlplane",
        "installDisk": "/dev/sda",
        "patches": [
            "apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp:\n  servers: [time.cloudflare.com]\n",
            "machine:\n  certSANs: [node.lab.internal]\n"
        ]
    });
    let mut child = Command::new(&oracle)
        .args(["bench", "2000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", oracle.display()))?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().context("oracle stdin")?;
        stdin
            .write_all(request.to_string().as_bytes())
            .context("write the request")?;
    }
    let output = child.wait_with_output().context("wait for the oracle")?;
    let result: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("parse the oracle's result")?;
    let talos = result["perSecond"]
        .as_f64()
        .with_context(|| format!("the oracle's benchmark failed: {result}"))?;

    let report = format!(
        "# Benchmark: rendering a machine config\n\n\
         A contract-1.14 control plane, from the golden test bundle, with a typed-document patch\n\
         and a v1alpha1 strategic patch (the same two patches for both); measured on this project's 2-core build machine.\n\n\
         | implementation | configs per second | time per config |\n\
         |---|---:|---:|\n\
         | ichor-render (criterion, release) | {ours:.0} | {:.1} µs |\n\
         | Talos `generate.Input.Config` + configpatcher (Go, pkg/machinery v1.14.1) | {talos:.0} | {:.1} µs |\n\n\
         Reproduce with `cargo xtask bench render`.\n",
        1e6 / ours,
        1e6 / talos
    );
    print!("\n{report}");
    let dir = root.join("docs/benchmarks");
    std::fs::create_dir_all(&dir).context("create docs/benchmarks")?;
    std::fs::write(dir.join("render.md"), report).context("write docs/benchmarks/render.md")?;
    Ok(())
}
