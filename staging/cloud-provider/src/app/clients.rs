//! `--use-service-account-credentials`: one ServiceAccount per controller client name in
//! `kube-system` (`node-controller`, `service-controller`, `route-controller`), whose tokens
//! (TokenRequest, 1 h) are written to a private file that the client re-reads, and refreshed
//! every 20 minutes until shutdown. Shared informers keep the root credentials.

use std::{path::PathBuf, time::Duration};

use k8s_controller_manager::{client::build_writer_client, private_files};
use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    config::AuthInfo,
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

const NAMESPACE: &str = "kube-system";
const TOKEN_SECONDS: i64 = 3600;
const REFRESH: Duration = Duration::from_secs(20 * 60);

async fn mint_token(root: &Client, name: &str) -> Result<String, String> {
    let sas: Api<ServiceAccount> = Api::namespaced(root.clone(), NAMESPACE);
    if sas
        .get_opt(name)
        .await
        .map_err(|e| format!("reading service account {NAMESPACE}/{name}: {e}"))?
        .is_none()
    {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating service account {NAMESPACE}/{name}: {e}")),
        }
    }
    // Spec and status are read through JSON: their fields' types differ between k8s-openapi's
    // API versions (`audiences`, `status.token` are optional from 1.36 on), and the binary, not
    // this library, chooses the version.
    let spec = serde_json::json!({ "audiences": [], "expirationSeconds": TOKEN_SECONDS });
    let request = TokenRequest {
        spec: serde_json::from_value(spec).map_err(|e| format!("building a TokenRequest: {e}"))?,
        ..Default::default()
    };
    let answer: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("requesting a token for service account {NAMESPACE}/{name}: {e}"))?;
    answer
        .status
        .and_then(|status| serde_json::to_value(status).ok())
        .and_then(|status| status.get("token")?.as_str().map(str::to_string))
        .filter(|token| !token.is_empty())
        .ok_or_else(|| format!("TokenRequest for {NAMESPACE}/{name} returned no token"))
}

/// The private directory for this process's service-account tokens: a new
/// `cloud-controller-manager-<pid>-<random>` under the temporary directory, mode 0700 (never an
/// existing directory, so nobody can plant one for us).
fn token_dir() -> Result<PathBuf, String> {
    static DIR: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        private_files::new_private_dir(
            &std::env::temp_dir(),
            &format!("cloud-controller-manager-{}", std::process::id()),
        )
        .map_err(|e| e.to_string())
    })
    .clone()
}

fn write_private(path: &std::path::Path, token: &str) -> Result<(), String> {
    private_files::write_private(path, token.as_bytes()).map_err(|e| e.to_string())
}

/// A client authenticated as the ServiceAccount `kube-system/<name>`.
pub(super) async fn service_account_client(
    root: &Client,
    base: &kube::Config,
    name: &str,
    qps: f32,
    burst: u32,
    shutdown: CancellationToken,
) -> Result<Client, String> {
    let token = mint_token(root, name).await?;
    let path = token_dir()?.join(format!("{name}.token"));
    write_private(&path, &token)?;
    let mut config = base.clone();
    config.auth_info = AuthInfo {
        token_file: Some(path.display().to_string()),
        ..Default::default()
    };
    let client = build_writer_client(
        config,
        qps,
        burst,
        &format!("cloud-controller-manager/{name}"),
        name,
        None,
    )
    .map_err(|e| e.to_string())?;
    let (root, name) = (root.clone(), name.to_string());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH) => {}
                _ = shutdown.cancelled() => {
                    let _ = std::fs::remove_file(&path);
                    return;
                }
            }
            match mint_token(&root, &name)
                .await
                .and_then(|t| write_private(&path, &t))
            {
                Ok(()) => {}
                Err(e) => {
                    warn!(service_account = %name, error = %e, "could not refresh the controller's token")
                }
            }
        }
    });
    Ok(client)
}
