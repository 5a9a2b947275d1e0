//! `hack/verify-boundaries`: prints one line per violated layout rule and exits 1 on any;
//! `--report` prints what each cloud-controller-manager binary links.

use std::{path::PathBuf, process::ExitCode};

use verify_boundaries::Workspace;

fn main() -> anyhow::Result<ExitCode> {
    let mut manifest = PathBuf::from("Cargo.toml");
    let mut report = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--manifest-path" => {
                manifest = args
                    .next()
                    .map(PathBuf::from)
                    .ok_or_else(|| anyhow::anyhow!("--manifest-path needs a value"))?
            }
            "--report" => report = true,
            "-h" | "--help" => {
                println!("verify-boundaries [--manifest-path Cargo.toml] [--report]");
                return Ok(ExitCode::SUCCESS);
            }
            other => anyhow::bail!("unknown argument {other:?} (try --help)"),
        }
    }
    let ws = Workspace::load(&manifest)?;
    if report {
        for line in ws.report() {
            println!("{line}");
        }
    }
    let violations = ws.check();
    for v in &violations {
        println!("{v}");
    }
    if violations.is_empty() {
        println!(
            "verify-boundaries: ok ({} members, providers: {})",
            ws.members.len(),
            ws.providers
                .iter()
                .map(|(p, d)| format!("{p} phase {}", d.phase))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("verify-boundaries: {} violation(s)", violations.len());
        Ok(ExitCode::FAILURE)
    }
}
