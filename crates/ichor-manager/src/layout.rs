//! The crate's layout rule (see the crate doc), checked: no two modules of a folder differ only
//! by a suffix, each controller folder and each flow folder below it has its `mod.rs` and
//! `plan.rs` (and each controller its `observe.rs` and `act.rs`), a `plan.rs` does no I/O, and
//! an `observe.rs` writes nothing. Functions stay short through clippy (`too_many_lines`,
//! `clippy.toml`).

use std::path::{Path, PathBuf};

/// The crate's `src` folder.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every folder below `dir`, `dir` included.
fn folders(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).expect("a folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            all.extend(folders(&path));
        }
    }
    all
}

/// The module names of a folder: its `.rs` files but `mod.rs` and `lib.rs`, and its folders.
fn modules(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("a folder")
        .filter_map(|entry| {
            let path = entry.expect("an entry").path();
            let name = path.file_name()?.to_str()?.to_owned();
            if path.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs")
                    .filter(|stem| !["mod", "lib"].contains(stem))
                    .map(str::to_owned)
            }
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The pairs of modules of one folder where one name is the other's with a suffix.
pub(crate) fn suffix_twins(names: &[String]) -> Vec<(String, String)> {
    let mut twins = Vec::new();
    for short in names {
        for long in names {
            if long != short && long.starts_with(short.as_str()) {
                twins.push((short.clone(), long.clone()));
            }
        }
    }
    twins
}

/// What in `text` (a `plan.rs`) reads or writes outside the process, by line.
pub(crate) fn io_in_plan(text: &str) -> Vec<String> {
    const IO: [&str; 9] = [
        "async ",
        ".await",
        "tokio::",
        "kube::Client",
        "Api<",
        "Api::",
        "TalosClient",
        "object_store",
        "std::fs",
    ];
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| IO.iter().any(|io| line.contains(io)))
        .map(|(n, line)| format!("line {}: {}", n + 1, line.trim()))
        .collect()
}

/// What in `text` (an `observe.rs`) writes: to the apiserver, to a node, to an object store.
pub(crate) fn writes_in_observe(text: &str) -> Vec<String> {
    const WRITES: [&str; 24] = [
        // The apiserver.
        ".create(",
        ".patch(",
        ".patch_status(",
        ".replace(",
        ".delete(",
        "status::apply",
        "finalizer::",
        ".event(",
        "publish(",
        "claims::take",
        "claims::hold",
        "claims::release",
        // A node.
        ".apply_configuration(",
        ".bootstrap(",
        ".reset(",
        ".reboot(",
        ".upgrade(",
        ".wipe(",
        ".etcd_leave(",
        ".etcd_remove_member(",
        ".etcd_forfeit_leadership(",
        ".etcd_recover(",
        // An object store.
        ".put(",
        ".put_multipart(",
    ];
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| WRITES.iter().any(|w| line.contains(w)))
        .map(|(n, line)| format!("line {}: {}", n + 1, line.trim()))
        .collect()
}

#[test]
fn no_two_modules_of_a_folder_differ_only_by_a_suffix() {
    for dir in folders(&src()) {
        let twins = suffix_twins(&modules(&dir));
        assert!(
            twins.is_empty(),
            "{}: {twins:?}: name each for what it holds (the layout rule, in the crate doc)",
            dir.display()
        );
    }
}

#[test]
fn each_controller_and_flow_folder_has_its_reconcile_and_its_plan() {
    let controllers = src().join("controller");
    let mut seen = 0;
    for dir in folders(&controllers)
        .into_iter()
        .filter(|d| *d != controllers)
    {
        for file in ["mod.rs", "plan.rs"] {
            assert!(
                dir.join(file).is_file(),
                "{} has no {file}: a controller's (or a flow's) folder holds its reconcile in \
                 mod.rs and its pure decisions in plan.rs",
                dir.display()
            );
        }
        seen += 1;
    }
    assert!(seen >= 5, "the five controllers' folders: {seen}");
}

#[test]
fn a_plan_does_no_io() {
    for dir in folders(&src().join("controller")) {
        let plan = dir.join("plan.rs");
        let Ok(text) = std::fs::read_to_string(&plan) else {
            continue;
        };
        let io = io_in_plan(&text);
        assert!(
            io.is_empty(),
            "{} does I/O (a plan is synchronous and reads no client): {io:#?}",
            plan.display()
        );
    }
}

#[test]
fn an_observe_writes_nothing() {
    let mut seen = 0;
    for dir in folders(&src().join("controller")) {
        let observe = dir.join("observe.rs");
        let Ok(text) = std::fs::read_to_string(&observe) else {
            continue;
        };
        let writes = writes_in_observe(&text);
        assert!(
            writes.is_empty(),
            "{} writes (an observe only reads and returns what it saw; act.rs writes): \
             {writes:#?}",
            observe.display()
        );
        seen += 1;
    }
    assert!(seen >= 5, "the five controllers' observe.rs: {seen}");
}

#[test]
fn each_controller_observes_and_acts_in_files_of_their_own() {
    let controllers = src().join("controller");
    for kind in ["backup", "cluster", "machine", "operation", "storage"] {
        for file in ["observe.rs", "act.rs"] {
            assert!(
                controllers.join(kind).join(file).is_file(),
                "controller/{kind} has no {file}: a controller reads in observe.rs and writes \
                 in act.rs"
            );
        }
    }
}

#[test]
fn the_checks_see_what_they_refuse() {
    let names = ["adopt", "adoption", "plan"].map(str::to_owned);
    assert_eq!(
        suffix_twins(&names),
        [("adopt".to_owned(), "adoption".to_owned())]
    );
    assert_eq!(
        io_in_plan("fn a() {}\npub async fn b(api: Api<X>) {}\n// .await in a comment").len(),
        1
    );
    assert_eq!(
        writes_in_observe("let m = api.get(&name).await?;\napi.patch(&n, &p, &x).await?;\n// .reset( in a comment\nclient.reset(options).await?;\nlet at = rebooted_since(x);").len(),
        2
    );
}
