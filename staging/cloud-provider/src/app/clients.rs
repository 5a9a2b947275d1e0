//! `--use-service-account-credentials`: one ServiceAccount per controller client name in
//! `kube-system` (`node-controller`, `service-controller`, `route-controller`), whose tokens
//! (TokenRequest, 1 h) are written to a private file that the client re-reads, and refreshed
//! every 20 minutes until shutdown. Shared informers keep the root credentials.

use std::{path::PathBuf, time::Duration};

use k8s_controller_manager::client::build_client;
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
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
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("requesting a token for service account {NAMESPACE}/{name}: {e}"))?;
    answer
        .status
        .map(|s| s.token)
        .ok_or_else(|| format!("TokenRequest for {NAMESPACE}/{name} returned no token"))
}

fn token_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("cloud-controller-manager-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

fn write_private(path: &PathBuf, token: &str) -> Result<(), String> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    f.write_all(token.as_bytes())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("writing {}: {e}", path.display()))
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
    let client = build_client(config, qps, burst, &format!("cloud-controller-manager/{name}"))
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
