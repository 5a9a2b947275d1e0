//! The container images of `hack/build-image.sh`: built here from the binaries and Debian's
//! packages (no registry pull), unpacked with umoci, and the binary run from the unpacked root
//! filesystem alone (chroot); the image config names the entrypoint and the non-root user.

use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use rcp_e2e::paths;
use serde_json::Value;

/// The workspace version: the image tag and what `--version` prints.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A blob of an OCI layout, by digest (`sha256:…`), as JSON.
fn blob(layout: &std::path::Path, digest: &str) -> Result<Value> {
    let (algo, hex) = digest.split_once(':').context("digest")?;
    let text = std::fs::read_to_string(layout.join("blobs").join(algo).join(hex))?;
    Ok(serde_json::from_str(&text)?)
}

#[test]
fn images_hold_only_the_binary_its_libraries_and_certificates_and_run_as_non_root() -> Result<()> {
    let out = tempfile::Builder::new().prefix("rcp-images-").tempdir()?;
    // The dev profile: the binaries the other tests use are already built (release takes
    // ~15 min per binary; the script defaults to it).
    let log = run(Command::new(paths::workspace_root().join("hack/build-image.sh"))
        .args(["--profile", "dev", "--out"])
        .arg(out.path())
        .args(["aws", "vsphere"]))?;
    println!("{log}");
    for provider in ["aws", "vsphere"] {
        let bin = format!("cloud-controller-manager-{provider}");
        let layout = out.path().join(&bin);
        let index: Value = serde_json::from_str(&std::fs::read_to_string(layout.join("index.json"))?)?;
        let manifest_ref = &index["manifests"][0];
        assert_eq!(
            manifest_ref["annotations"]["org.opencontainers.image.ref.name"], VERSION,
            "{bin}: tagged with the version"
        );
        let manifest = blob(&layout, manifest_ref["digest"].as_str().context("digest")?)?;
        let config = blob(&layout, manifest["config"]["digest"].as_str().context("config")?)?;
        assert_eq!(config["os"], "linux");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/usr/local/bin/cloud-controller-manager"]),
            "{bin}"
        );
        assert_eq!(config["config"]["User"], "65532:65532", "{bin}: non-root");
        assert_eq!(
            manifest["layers"].as_array().map(Vec::len),
            Some(1),
            "{bin}: one layer"
        );
        let packages = config["config"]["Labels"]["io.rust-cloud-provider.debian-packages"]
            .as_str()
            .unwrap_or_default();
        assert!(
            packages.contains("libc6") && packages.contains("ca-certificates"),
            "{bin}: {packages}"
        );

        // Unpack as any OCI runtime would, then run the binary from that root alone.
        let bundle = out.path().join(format!("{bin}-bundle"));
        run(Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(format!("{}:{VERSION}", layout.display()))
            .arg(&bundle))?;
        let rootfs = bundle.join("rootfs");
        ensure!(
            !rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin").exists(),
            "{bin}: no shell, no tools"
        );
        ensure!(
            rootfs.join("etc/ssl/certs/ca-certificates.crt").is_file(),
            "{bin}: CA certificates"
        );
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd"))?;
        ensure!(passwd.contains("nonroot:x:65532:65532"), "{bin}: {passwd}");
        let is_root = run(Command::new("id").arg("-u"))?.trim() == "0";
        let mut chroot = if is_root {
            Command::new("chroot")
        } else {
            let mut c = Command::new("unshare");
            c.args(["--map-root-user", "chroot"]);
            c
        };
        let version = run(chroot
            .arg(&rootfs)
            .args(["/usr/local/bin/cloud-controller-manager", "--version"]))?;
        assert!(version.contains(VERSION), "{bin}: {version}");
        let size: u64 = std::fs::read_dir(layout.join("blobs/sha256"))?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        println!(
            "{bin}: image {} KiB (dev profile), --version: {}",
            size / 1024,
            version.trim()
        );
    }
    Ok(())
}
