//! `ecr-credential-provider`: the kubelet credential-provider plugin for Amazon ECR (see the
//! library's documentation). Reads a `CredentialProviderRequest` on stdin, writes the
//! `CredentialProviderResponse` on stdout; on error, one line on stderr and exit code 1. Logs go
//! to stderr (`RUST_LOG`, default `warn`); no credential is ever logged.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;

use ecr_credential_provider::{get_credentials, parse_request};

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--version") {
        println!("ecr-credential-provider {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
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
