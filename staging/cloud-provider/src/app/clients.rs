//! `--use-service-account-credentials`: one ServiceAccount per controller client name in
//! `kube-system` (`node-controller`, `service-controller`, `route-controller`), whose tokens
//! (TokenRequest, 1 h) the client holds in memory (never in a file: the CCM's root file system
//! is read-only and has no `/tmp`), refreshed every 20 minutes until shutdown. Shared informers
//! keep the root credentials.

use std::time::Duration;

use k8s_controller_manager::client::{BearerToken, build_writer_client_with_token};
use k8s_openapi::api::{authentication::v1::TokenRequest, core::v1::ServiceAccount};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
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

/// A client authenticated as the ServiceAccount `kube-system/<name>`.
pub(super) async fn service_account_client(
    root: &Client,
    base: &kube::Config,
    name: &str,
    qps: f32,
    burst: u32,
    shutdown: CancellationToken,
) -> Result<Client, String> {
    let token = BearerToken::new(&mint_token(root, name).await?).map_err(|_| {
        format!("the token minted for service account {NAMESPACE}/{name} is not a valid HTTP header value")
    })?;
    let client = build_writer_client_with_token(
        base.clone(),
        qps,
        burst,
        &format!("cloud-controller-manager/{name}"),
        name,
        None,
        &token,
    )
    .map_err(|e| e.to_string())?;
    let (root, name) = (root.clone(), name.to_string());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH) => {}
                _ = shutdown.cancelled() => return,
            }
            match mint_token(&root, &name).await.and_then(|t| {
                token
                    .replace(&t)
                    .map_err(|_| "the minted token is not a valid HTTP header value".to_string())
            }) {
                Ok(()) => {}
                Err(e) => {
                    warn!(service_account = %name, error = %e, "could not refresh the controller's token")
                }
            }
        }
    });
    Ok(client)
}
