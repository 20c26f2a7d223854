//! Writes the generated manifests (CRDs, admission policy) under the folder given as the only
//! argument. Run through `cargo xtask crdgen`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(root) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: crdgen <config folder>");
        return ExitCode::from(2);
    };
    let manifests = match ichor_api::manifests() {
        Ok(m) => m,
        Err(err) => {
            eprintln!("crdgen: cannot serialize manifests: {err}");
            return ExitCode::FAILURE;
        }
    };
    for manifest in manifests {
        let path = root.join(&manifest.path);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, &manifest.yaml));
        if let Err(err) = written {
            eprintln!("crdgen: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
