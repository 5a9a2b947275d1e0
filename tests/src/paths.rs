//! Where the test servers and the workspace's own binaries are.

use std::{
    path::PathBuf,
    process::Command,
    sync::{Mutex, OnceLock},
};

use anyhow::{Context, Result, bail};

/// The directory `hack/install-test-deps.sh` fills with symlinks to the test servers:
/// `$RCP_TEST_BIN_DIR`, else `${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rust-cloud-provider}/bin`.
pub fn test_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RCP_TEST_BIN_DIR") {
        return PathBuf::from(dir);
    }
    cache_dir().join("bin")
}

/// The project's cache directory (outside the repository).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RCP_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("rust-cloud-provider")
}

/// The path of an installed test server (`etcd`, `kube-apiserver`, `kubectl`, `moto_server`,
/// `vcsim`, `govc`), or an error telling how to install it.
pub fn test_bin(name: &str) -> Result<PathBuf> {
    let path = test_bin_dir().join(name);
    if !path.exists() {
        bail!(
            "test server binary {} is missing: run hack/install-test-deps.sh (or set RCP_TEST_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}

/// The workspace root. `CARGO_MANIFEST_DIR` is read when the test runs (cargo and nextest set
/// it) before the compile-time value: a build cache shared by checkouts at other paths can
/// hold a test binary, still fresh by its sources' times, compiled in another checkout.
pub fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Builds (if needed) and returns a binary of this workspace, e.g.
/// `workspace_binary("cloud-controller-manager-aws")`. Uses the same target directory and the
/// dev profile, so after `cargo test` it is a quick no-op; `RCP_CCM_PROFILE=release` (set by
/// the benchmarks' `--release`) uses the release profile instead.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    // Benchmarks compare builds: `RCP_CCM_BINARY` replaces every cloud-controller-manager.
    if name.starts_with("cloud-controller-manager-")
        && let Some(path) = std::env::var_os("RCP_CCM_BINARY")
    {
        return Ok(PathBuf::from(path));
    }
    static BUILT: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let release = std::env::var("RCP_CCM_PROFILE").is_ok_and(|p| p == "release");
    let path = target_dir
        .join(if release { "release" } else { "debug" })
        .join(name);
    if !built.iter().any(|b| b == name) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut args = vec!["build", "--quiet", "--bin", name];
        if release {
            args.push("--release");
        }
        let out = Command::new(cargo)
            .current_dir(workspace_root())
            .args(&args)
            .output()
            .with_context(|| format!("running cargo build --bin {name}"))?;
        if !out.status.success() {
            bail!(
                "cargo build --bin {name} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        built.push(name.to_string());
    }
    if !path.exists() {
        bail!("built {name} but {} does not exist", path.display());
    }
    Ok(path)
}

/// The version of the installed test Kubernetes (`v1.37.2`), as `kube-apiserver --version`
/// prints it, or `unknown` when it cannot be run.
pub fn kubernetes_version() -> String {
    test_bin("kube-apiserver")
        .ok()
        .and_then(|bin| Command::new(bin).arg("--version").output().ok())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .and_then(|v| v.rsplit(' ').next().map(str::to_string))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
