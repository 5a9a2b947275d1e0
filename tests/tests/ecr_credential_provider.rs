//! The real `ecr-credential-provider` binary, fed kubelet requests on stdin, against moto's ECR
//! and STS: the answer the kubelet reads, each API version, the region taken from the registry
//! host, the service-account-token mode, and clear errors (exit code ≠ 0) for a non-ECR image
//! and malformed input. No secret in any output.

use std::io::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use rcp_e2e::{Moto, paths, secrets};
use serde_json::Value;

const PRIVATE_HOST: &str = "123456789012.dkr.ecr.us-west-2.amazonaws.com";

/// What one run of the plugin printed.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(moto: &Moto, input: &str, extra_env: &[(&str, &str)]) -> Result<Run> {
    let bin = paths::workspace_binary("ecr-credential-provider")?;
    let mut child = Command::new(bin)
        .env_clear()
        .envs(moto.sdk_env())
        .env("AWS_ENDPOINT_URL", moto.endpoint())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(extra_env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ecr-credential-provider")?;
    child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    let run = Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    secrets::assert_none_in("ecr-credential-provider stdout", &run.stdout);
    secrets::assert_none_in("ecr-credential-provider stderr", &run.stderr);
    Ok(run)
}

fn request(version: &str, image: &str) -> String {
    format!(
        r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/{version}","kind":"CredentialProviderRequest","image":"{image}"}}"#
    )
}

/// The ECR requests moto received (JSON protocol: the action is in `x-amz-target`), with the
/// credential scope of their signature (`<key>/<date>/<region>/<service>/aws4_request`).
fn ecr_calls(moto: &Moto) -> Vec<(String, String)> {
    moto.recorded()
        .into_iter()
        .filter_map(|(headers, _)| {
            let target = headers.get("x-amz-target")?.clone();
            let scope = headers
                .get("authorization")
                .and_then(|a| a.split("Credential=").nth(1))
                .and_then(|c| c.split(',').next())
                .unwrap_or_default()
                .to_string();
            Some((target, scope))
        })
        .collect()
}

#[tokio::test]
async fn answers_the_kubelet_for_a_private_registry_in_every_api_version() -> Result<()> {
    let moto = Moto::start().await?;
    for version in ["v1", "v1beta1", "v1alpha1"] {
        let out = run(
            &moto,
            &request(version, &format!("{PRIVATE_HOST}/team/app:1.0")),
            &[],
        )?;
        assert!(out.ok, "{version}: {}", out.stderr);
        let answer: Value = serde_json::from_str(&out.stdout)
            .with_context(|| format!("{version}: the answer is JSON: {}", out.stdout))?;
        assert_eq!(
            answer["apiVersion"],
            format!("credentialprovider.kubelet.k8s.io/{version}")
        );
        assert_eq!(answer["kind"], "CredentialProviderResponse");
        assert_eq!(answer["cacheKeyType"], "Registry");
        // moto's tokens expired in 2015: half of a negative life is no caching, so the field is
        // left out, as upstream does (the positive case is a unit test of cache_duration).
        assert!(answer.get("cacheDuration").is_none(), "{answer}");
        let auth = answer["auth"].as_object().context("auth")?;
        assert_eq!(auth.len(), 1, "one entry, for the image's host: {answer}");
        assert_eq!(auth[PRIVATE_HOST]["username"], "AWS");
        // moto's token is base64("AWS:<account>-auth-token").
        assert_eq!(auth[PRIVATE_HOST]["password"], "123456789012-auth-token");
    }
    let calls = ecr_calls(&moto);
    assert_eq!(calls.len(), 3, "one GetAuthorizationToken per request: {calls:?}");
    for (target, scope) in &calls {
        assert!(target.ends_with(".GetAuthorizationToken"), "{target}");
        assert!(
            scope.contains("/us-west-2/ecr/"),
            "the region comes from the registry host: {scope}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn service_account_token_assumes_the_role_of_the_annotation() -> Result<()> {
    let moto = Moto::start().await?;
    let sa_token = "eyJhbGciOiJSUzI1NiJ9.rcp-sentinel-service-account-token.sig";
    secrets::register(sa_token);
    let input = format!(
        r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"{PRIVATE_HOST}/app","serviceAccountToken":"{sa_token}","serviceAccountAnnotations":{{"eks.amazonaws.com/ecr-role-arn":"arn:aws:iam::123456789012:role/ecr-pull"}}}}"#
    );
    let out = run(&moto, &input, &[("RUST_LOG", "info")])?;
    assert!(out.ok, "{}", out.stderr);
    let bodies = moto.requests();
    let assume = bodies
        .iter()
        .find(|b| b.contains("Action=AssumeRoleWithWebIdentity"))
        .with_context(|| format!("STS AssumeRoleWithWebIdentity was called: {bodies:?}"))?;
    assert!(
        assume.contains("RoleSessionName=ecr-credential-provider"),
        "{assume}"
    );
    assert!(assume.contains("ecr-pull"), "{assume}");
    // The ECR call is signed with the assumed role's key, not the static one of the chain.
    let calls = ecr_calls(&moto);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        !calls[0].1.starts_with("AKIDTEST/"),
        "ECR was called with the assumed credentials: {calls:?}"
    );

    // The role from AWS_ECR_ROLE_ARN when the service account names none; without a token the
    // default chain (static key) is used even when the variable is set.
    let input = format!(
        r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"{PRIVATE_HOST}/app","serviceAccountToken":"{sa_token}"}}"#
    );
    let env_role = [("AWS_ECR_ROLE_ARN", "arn:aws:iam::123456789012:role/from-env")];
    assert!(run(&moto, &input, &env_role)?.ok);
    assert!(
        moto.requests().iter().any(|b| b.contains("from-env")),
        "the role of AWS_ECR_ROLE_ARN was assumed"
    );
    assert!(run(&moto, &request("v1", &format!("{PRIVATE_HOST}/app")), &env_role)?.ok);
    let calls = ecr_calls(&moto);
    assert!(
        calls
            .last()
            .is_some_and(|(_, scope)| scope.starts_with("AKIDTEST/")),
        "{calls:?}"
    );
    Ok(())
}

#[tokio::test]
async fn ecr_public_is_asked_in_us_east_1() -> Result<()> {
    let moto = Moto::start().await?;
    // moto has no ECR Public: the call fails, but moto's log shows which API and region were
    // asked.
    let out = run(&moto, &request("v1", "public.ecr.aws/nginx/nginx:latest"), &[])?;
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr.contains("ecr-public:GetAuthorizationToken failed"),
        "{}",
        out.stderr
    );
    // moto names the service and region it could not serve: those of the request's signature.
    let log = moto.log();
    assert!(
        log.contains("Unable to find appropriate backend for ecr-public.us-east-1.amazonaws.com"),
        "{log}"
    );
    assert!(ecr_calls(&moto).is_empty(), "private ECR was not asked");
    Ok(())
}

#[tokio::test]
async fn bad_requests_fail_with_a_clear_error_and_never_call_aws() -> Result<()> {
    let moto = Moto::start().await?;
    for (input, needle) in [
        (request("v1", "docker.io/library/nginx:1.27"), "registry host \"docker.io\" is not an Amazon ECR registry"),
        (request("v1", "registry.k8s.io/pause:3.10"), "\"registry.k8s.io\" is not an Amazon ECR registry"),
        ("{\"apiVersion\": ".to_string(), "not a valid CredentialProviderRequest"),
        (String::new(), "not a valid CredentialProviderRequest"),
        (request("v2", &format!("{PRIVATE_HOST}/app")), "apiVersion \"credentialprovider.kubelet.k8s.io/v2\" is not supported"),
        (
            format!(r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","image":"{PRIVATE_HOST}/app"}}"#),
            "kind was \"CredentialProviderResponse\"",
        ),
        (r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":""}"#.to_string(), "image in plugin request was empty"),
    ] {
        let out = run(&moto, &input, &[])?;
        assert!(!out.ok, "{input:?} must fail: {}", out.stdout);
        assert!(out.stdout.is_empty(), "nothing on stdout on error: {}", out.stdout);
        assert!(
            out.stderr.contains("ecr-credential-provider: error:") && out.stderr.contains(needle),
            "{input:?}: {}",
            out.stderr
        );
    }
    assert!(ecr_calls(&moto).is_empty(), "no AWS call for a bad request");
    Ok(())
}

/// The kubelet's `matchImages` rule: same number of DNS labels, each label matched by its glob
/// (`*` within one label only); a pattern without a path matches every path.
fn kubelet_matches(pattern: &str, image: &str) -> bool {
    let host = image.split('/').next().unwrap_or_default();
    let (p_labels, h_labels): (Vec<&str>, Vec<&str>) =
        (pattern.split('.').collect(), host.split('.').collect());
    p_labels.len() == h_labels.len()
        && p_labels.iter().zip(&h_labels).all(|(p, h)| {
            let re = format!("^{}$", regex::escape(p).replace("\\*", "[^.]*"));
            regex::Regex::new(&re).is_ok_and(|r| r.is_match(h))
        })
}

#[tokio::test]
async fn the_example_kubelet_config_sends_every_ecr_host_and_nothing_else() -> Result<()> {
    let path = paths::workspace_root().join("deploy/aws/kubelet/credential-provider-config.yaml");
    let config: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("{} is YAML", path.display()))?;
    assert_eq!(config["kind"], "CredentialProviderConfig");
    let provider = &config["providers"][0];
    assert_eq!(
        provider["name"], "ecr-credential-provider",
        "the name is the binary's"
    );
    let patterns: Vec<&str> = provider["matchImages"]
        .as_array()
        .context("matchImages")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let sent = |image: &str| patterns.iter().any(|p| kubelet_matches(p, image));
    for image in [
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1",
        "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com/app",
        "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/app",
        "123456789012.dkr-ecr.us-east-1.on.aws/app",
        "123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov/app",
        "public.ecr.aws/nginx/nginx:latest",
    ] {
        assert!(sent(image), "the kubelet asks the plugin for {image}");
    }
    for image in [
        "docker.io/library/nginx",
        "registry.k8s.io/pause:3.10",
        "ghcr.io/a/b",
    ] {
        assert!(!sent(image), "the kubelet does not ask the plugin for {image}");
    }
    // The plugin answers in the apiVersion the config sets.
    let moto = Moto::start().await?;
    let version = provider["apiVersion"]
        .as_str()
        .and_then(|v| v.rsplit('/').next())
        .context("apiVersion")?;
    let out = run(&moto, &request(version, &format!("{PRIVATE_HOST}/app")), &[])?;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout
            .contains(provider["apiVersion"].as_str().unwrap_or("?")),
        "{}",
        out.stdout
    );
    Ok(())
}
