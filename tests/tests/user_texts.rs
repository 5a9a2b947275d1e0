//! What a person reads: every binary's `--help` opens with text written for the person running
//! it (not a flag struct's doc comment), every command's help with its own description,
//! `ecr-credential-provider --help` answers without reading stdin, and a CCM's log written to
//! a file holds no terminal escape sequences (colours only on a terminal).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use rcp_e2e::{TestCluster, ccm::CcmProcess, k8s::wait_for, paths};

/// Phrases of the code's own documentation that must never open a `--help`.
const INTERNAL: [&str; 5] = ["clap", "Field names", "The flags of", "The command's flags", "`"];

fn help(binary: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(paths::workspace_binary(binary)?)
        .args(args)
        .arg("--help")
        .stdin(Stdio::null())
        .output()?;
    ensure!(out.status.success(), "{binary} {args:?} --help failed: {out:?}");
    Ok(String::from_utf8(out.stdout)?)
}

/// The commands a `--help` lists, with their descriptions.
fn commands(help: &str) -> Vec<(String, String)> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        // A description that wraps goes on in lines indented further.
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| {
            let (name, about) = l.trim().split_once(char::is_whitespace)?;
            (name != "help").then(|| (name.to_string(), about.trim().to_string()))
        })
        .collect()
}

#[test]
fn every_help_opens_with_text_for_the_person_running_it() -> Result<()> {
    for binary in [
        "cloud-controller-manager-aws",
        "cloud-controller-manager-vsphere",
        "cloud-controller-manager-openstack",
    ] {
        let text = help(binary, &[])?;
        let first = text.lines().next().unwrap_or_default();
        println!("{binary} --help: {first}");
        assert!(
            first.starts_with("The Cloud controller manager is a daemon"),
            "{binary}: {first}"
        );
        for (name, about) in commands(&text) {
            let sub = help(binary, &[&name])?;
            let sub_first = sub.lines().next().unwrap_or_default();
            println!("{binary} {name} --help: {sub_first}");
            assert!(
                !INTERNAL.iter().any(|p| sub_first.contains(p)),
                "{binary} {name}: {sub_first}"
            );
            // Both wrap at different columns: the first words must be the same.
            let words = |t: &str| t.split_whitespace().take(5).collect::<Vec<_>>().join(" ");
            assert_eq!(
                words(sub_first),
                words(&about),
                "{binary} {name}: the command's own description opens its help"
            );
        }
    }
    Ok(())
}

#[test]
fn ecr_credential_provider_answers_help_and_version_without_reading_stdin() -> Result<()> {
    for arg in ["--help", "--version"] {
        // stdin stays open: a program that read it would never finish.
        let mut child = Command::new(paths::workspace_binary("ecr-credential-provider")?)
            .arg(arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                anyhow::bail!("ecr-credential-provider {arg} waited for stdin");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(stdin);
        let out = child.wait_with_output()?;
        let text = String::from_utf8(out.stdout)?;
        assert!(status.success(), "{arg}: {text}");
        match arg {
            "--help" => assert!(text.contains("Usage: ecr-credential-provider"), "{text}"),
            _ => assert!(text.starts_with("ecr-credential-provider "), "{text}"),
        }
    }
    let out = Command::new(paths::workspace_binary("ecr-credential-provider")?)
        .arg("--bogus")
        .stdin(Stdio::null())
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"--bogus\""));
    Ok(())
}

#[tokio::test]
async fn a_log_written_to_a_file_holds_no_terminal_escapes() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let fake = cluster.dir().join("fake.json");
    std::fs::write(&fake, "{}")?;
    let ccm = CcmProcess::start(
        "fake-cloud-controller-manager",
        "ccm-plain-log",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            format!("--cloud-config={}", fake.display()),
            "--cluster-cidr=10.244.0.0/16".into(),
            "--leader-elect=false".into(),
        ],
    )?;
    wait_for(
        "the CCM to start its controllers",
        Duration::from_secs(60),
        || async { ccm.log().contains("Serving securely").then_some(()) },
    )
    .await
    .context(ccm.log())?;
    let log = ccm.log();
    assert!(
        !log.contains('\u{1b}'),
        "terminal escapes in the log file:\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains(" address=127.0.0.1:")),
        "fields are plain key=value text:\n{log}"
    );
    Ok(())
}
