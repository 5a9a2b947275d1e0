//! `ecr-credential-provider`: the kubelet credential-provider plugin for Amazon ECR (see the
//! library's documentation). Reads a `CredentialProviderRequest` on stdin, writes the
//! `CredentialProviderResponse` on stdout; on error, one line on stderr and exit code 1. Logs go
//! to stderr (`RUST_LOG`, default `warn`); no credential is ever logged.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;

use ecr_credential_provider::{get_credentials, parse_request};

/// What `--help` prints.
const HELP: &str = "\
ecr-credential-provider: the kubelet's image credential provider for Amazon ECR.

The kubelet runs it (--image-credential-provider-config, --image-credential-provider-bin-dir)
for images on ECR registries: it reads a CredentialProviderRequest (JSON) on stdin and writes a
CredentialProviderResponse with a registry login on stdout. AWS credentials come from the
usual AWS SDK sources (environment, shared config, the instance's role). Logs go to stderr
(RUST_LOG, default warn); no credential is ever logged.

Usage: ecr-credential-provider [--help | --version] < request.json
";

fn main() -> ExitCode {
    if let Some(arg) = std::env::args().nth(1) {
        match arg.as_str() {
            "--version" => {
                println!("ecr-credential-provider {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "--help" | "-h" => {
                print!("{HELP}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("ecr-credential-provider: error: unknown argument {other:?} (see --help)");
                return ExitCode::FAILURE;
            }
        }
    }
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ecr-credential-provider: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("reading the request from stdin")?;
    let (version, request) = parse_request(&input)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let response = runtime.block_on(get_credentials(version, &request, |k| std::env::var(k).ok()))?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &response)?;
    out.flush()?;
    Ok(())
}
