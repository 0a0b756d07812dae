//! The workspace's `rust-version` tells the truth: no locked package declares a higher one.
//!
//! `cargo metadata --locked` lists every package of `Cargo.lock` (all targets' platforms) with
//! the `rust-version` its manifest declares; the workspace's must be at least the highest.

use std::process::Command;

use serde_json::Value;

/// `"1.89"`, `"1.89.0"` → `(1, 89, 0)`; a missing part counts as 0.
fn parse(v: &str) -> (u64, u64, u64) {
    let mut parts = v.split('.').map(|p| {
        p.parse::<u64>()
            .unwrap_or_else(|_| panic!("rust-version {v:?} is not a version"))
    });
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

fn metadata(offline: bool) -> Option<Value> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if offline {
        cmd.arg("--offline");
    }
    let out = cmd.output().expect("running cargo metadata");
    if !out.status.success() {
        eprintln!(
            "cargo metadata (offline: {offline}) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON"))
}

#[test]
fn no_locked_package_needs_a_newer_rust_than_the_workspace_declares() {
    // Offline first; a fresh checkout may not have downloaded the other platforms' crates yet
    // (metadata reads every locked manifest), and then cargo may fetch them.
    let meta = metadata(true)
        .or_else(|| metadata(false))
        .expect("cargo metadata --locked succeeds");
    let packages = meta["packages"].as_array().expect("packages");
    let root = env!("CARGO_PKG_NAME");
    let declared = packages
        .iter()
        .find(|p| p["name"] == root && p["source"].is_null())
        .and_then(|p| p["rust_version"].as_str())
        .expect("the root package declares a rust-version");
    let ours = parse(declared);
    let mut too_new: Vec<String> = packages
        .iter()
        .filter_map(|p| {
            let v = p["rust_version"].as_str()?;
            let (name, version) = (p["name"].as_str()?, p["version"].as_str()?);
            (parse(v) > ours).then(|| format!("{name} {version} (rust-version {v})"))
        })
        .collect();
    too_new.sort();
    assert!(
        too_new.is_empty(),
        "the workspace declares rust-version {declared}, but {} locked package(s) need more: \
         raise [workspace.package] rust-version in Cargo.toml to the highest of:\n  {}",
        too_new.len(),
        too_new.join("\n  ")
    );
}

#[test]
fn versions_compare_by_number() {
    assert_eq!(parse("1.89"), (1, 89, 0));
    assert!(parse("1.89.0") <= parse("1.89"));
    assert!(parse("1.100") > parse("1.89"));
    assert!(parse("1.88") < parse("1.89.0"));
}
