//! The secure serving port of the controller manager: `/healthz`, `/livez`, `/readyz` and
//! `/metrics` over HTTPS, with delegated authentication and authorization.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The metrics registry (with the provider's metrics) and the HTTPS endpoints, serving.
pub(super) async fn start_serving(
    opts: &Options,
    cloud: &dyn CloudProvider,
    shutdown: &CancellationToken,
) -> Result<(Arc<Metrics>, Endpoints), AppError> {
    let metrics = Arc::new(Metrics::new());
    cloud.register_metrics(&metrics);
    let endpoints = Endpoints {
        healthz: HealthChecks::default(),
        livez: HealthChecks::default(),
        readyz: HealthChecks::default(),
        metrics: metrics.clone(),
    };
    if opts.serving.secure_port == 0 {
        serve(
            &serving_options(opts, None),
            endpoints.clone(),
            None,
            shutdown.clone(),
        )
        .await?;
        return Ok((metrics, endpoints));
    }
    let (delegation, client_ca) = delegation(opts).await?;
    serve(
        &serving_options(opts, client_ca),
        endpoints.clone(),
        Some(delegation),
        shutdown.clone(),
    )
    .await?;
    Ok((metrics, endpoints))
}

pub(super) fn serving_options(opts: &Options, client_ca: Option<ClientCa>) -> ServingOptions {
    ServingOptions {
        bind_address: opts.serving.bind_address,
        secure_port: opts.serving.secure_port,
        tls_cert_file: opts.serving.tls_cert_file.clone(),
        tls_private_key_file: opts.serving.tls_private_key_file.clone(),
        cert_dir: opts.serving.cert_dir.clone(),
        pair_name: "cloud-controller-manager".into(),
        client_ca,
        sni_cert_keys: opts.serving.tls_sni_cert_key.clone(),
        tls_min_version: opts.serving.tls_min_version.clone(),
        tls_cipher_suites: opts.serving.tls_cipher_suites.clone(),
        // Checked by `Options::validate`.
        tls_curve_preferences: opts.serving.curve_ids().unwrap_or_default(),
        disable_http2: opts.serving.disable_http2_serving,
        http2_max_streams_per_connection: opts.serving.http2_max_streams_per_connection,
        permit_port_sharing: opts.serving.permit_port_sharing,
    }
}

/// A client for the delegated checks: from `kubeconfig`, else in-cluster; `None` (with
/// upstream's warning) outside a cluster, as both kubeconfigs are optional upstream.
pub(super) async fn delegated_client(
    flag: &'static str,
    kubeconfig: Option<&std::path::Path>,
    without: &str,
) -> Result<Option<kube::Client>, AppError> {
    let config = match kubeconfig.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => load_config(Some(path), None).await.map_err(|e| {
            AppError::InvalidFlags(format!(
                "--{flag}: {}",
                e.to_string().trim_start_matches("--kubeconfig ")
            ))
        })?,
        None => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => {
                warn!("No {flag} provided, so {without} won't work.");
                return Ok(None);
            }
        },
    };
    kube::Client::try_from(config)
        .map(Some)
        .map_err(|e| AppError::InvalidFlags(format!("--{flag}: building the client: {e}")))
}

/// How often the cluster's client CA is read again.
const CLIENT_CA_REREAD: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads `kube-system/extension-apiserver-authentication` again every [`CLIENT_CA_REREAD`] and
/// sends its `client-ca-file` when it changed (as upstream's dynamic client CA follows the
/// ConfigMap), so a rotated API server client CA is trusted without a restart. A failed read
/// or a missing ConfigMap keeps the last bundle. Stops when the server stops listening.
fn follow_client_ca(client: kube::Client, first: String) -> tokio::sync::watch::Receiver<String> {
    let (tx, rx) = tokio::sync::watch::channel(first);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(CLIENT_CA_REREAD).await;
            if tx.is_closed() {
                return;
            }
            match lookup_client_ca(&client, true).await {
                Ok(Some(pem)) if *tx.borrow() != pem => {
                    info!(
                        "the cluster's client CA (configmap kube-system/extension-apiserver-authentication) changed"
                    );
                    if tx.send(pem).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "reading the cluster's client CA again failed; the last one stays")
                }
            }
        }
    });
    rx
}

/// The secure port's delegated authentication and authorization, and the client CA to ask
/// client certificates for (`--client-ca-file`, else the cluster's, unless
/// `--authentication-skip-lookup`).
pub(super) async fn delegation(opts: &Options) -> Result<(Delegation, Option<ClientCa>), AppError> {
    let authn = &opts.authentication;
    let authz = &opts.authorization;
    let authentication_client = delegated_client(
        "authentication-kubeconfig",
        authn.authentication_kubeconfig.as_deref(),
        "TokenReview of bearer tokens and the lookup of client-ca-file in configmap/extension-apiserver-authentication in kube-system",
    )
    .await?;
    let authorization_client = delegated_client(
        "authorization-kubeconfig",
        authz.authorization_kubeconfig.as_deref(),
        "SubjectAccessReview of authorization tokens",
    )
    .await?;
    let client_ca_file = authn
        .client_ca_file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty());
    let client_ca = match (client_ca_file, &authentication_client) {
        (Some(path), _) => Some(ClientCa {
            source: format!("--client-ca-file {}", path.display()),
            pem: std::fs::read_to_string(path)
                .map_err(|e| AppError::InvalidFlags(format!("--client-ca-file {}: {e}", path.display())))?,
            file: Some(path.clone()),
            updates: None,
        }),
        (None, Some(client)) if !authn.authentication_skip_lookup => {
            lookup_client_ca(client, authn.authentication_tolerate_lookup_failure)
                .await
                .map_err(|e| AppError::InvalidFlags(e.to_string()))?
                .map(|pem| ClientCa {
                    source: "configmap kube-system/extension-apiserver-authentication client-ca-file".into(),
                    updates: Some(follow_client_ca(client.clone(), pem.clone())),
                    pem,
                    file: None,
                })
        }
        _ => None,
    };
    let mut options = DelegationOptions::new(authentication_client, authorization_client);
    options.token_cache_ttl = authn.authentication_token_webhook_cache_ttl;
    options.always_allow_paths = authz.always_allow_paths();
    options.authorized_ttl = authz.authorization_webhook_cache_authorized_ttl;
    options.unauthorized_ttl = authz.authorization_webhook_cache_unauthorized_ttl;
    info!(
        token_review = options.authentication_client.is_some(),
        client_certificates = client_ca.is_some(),
        subject_access_review = options.authorization_client.is_some(),
        always_allow_paths = ?options.always_allow_paths,
        "secure port: delegated authentication and authorization"
    );
    Ok((Delegation::new(options), client_ca))
}
