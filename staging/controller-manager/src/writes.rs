//! Every write a controller manager makes, seen at one place: its Kubernetes clients.
//!
//! [`WriteLayer`] sits in each client's tower stack. It recognises the requests that change
//! the cluster (POST, PUT, PATCH, DELETE, except the review APIs that only ask a question:
//! TokenReview, SubjectAccessReview, …) and describes each as an [`Action`]: the Kubernetes verb
//! with the resource (`patch nodes/status`, `delete nodes`, `create events`) and the object
//! (`namespace/name`, or the namespace alone for a create).
//!
//! - In **normal mode** it only logs each write at `debug` level (`write`), so an operator (or
//!   a test) can see what the controller manager changed.
//! - In **dry-run mode** (shadow mode: `--dry-run`) it adds `dryRun=All` to the request, so the
//!   API server validates and admits it (RBAC, admission, conflicts) and answers as if it had
//!   been done, but persists nothing; the write is logged at `info` level (`dry run: would
//!   write`) and counted in [`DryRun::actions`] (`cloud_controller_manager_dry_run_actions_total
//!   {controller, action}`). The choke point is the client, so no controller can forget it.
//!
//! Cloud writes are recorded by the same [`DryRun`] (the cloud-provider crate wraps the
//! provider's load balancer and route calls for that; a provider guards its own other writes).

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use prometheus::{IntCounterVec, Opts};
use tower::{Layer, Service};
use tracing::{debug, info};

/// The name of the dry-run metric.
pub const DRY_RUN_ACTIONS_TOTAL: &str = "cloud_controller_manager_dry_run_actions_total";

/// A write recognised in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// The Kubernetes verb and resource, e.g. `patch nodes/status`; `create leases.coordination.k8s.io`.
    pub action: String,
    /// `namespace/name`, `name` (cluster scoped), or the namespace alone (or empty) for a create.
    pub object: String,
}

impl Action {
    /// The write that `method` on `path` (an API server path, without the query) makes, or
    /// `None` for a read or a review request (which asks a question and stores nothing).
    pub fn of_request(method: &http::Method, path: &str) -> Option<Self> {
        let verb = match *method {
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => return None,
        };
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        // /api/v1/… or /apis/<group>/<version>/…
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => ("", &segments[..]),
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
            _ => (None, rest),
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(*name), None),
            [resource, name, sub, ..] => (*resource, Some(*name), Some(*sub)),
            [] => ("namespaces", None, None),
        };
        if verb == "create"
            && (resource.ends_with("reviews")
                || (resource == "serviceaccounts" && subresource == Some("token")))
        {
            return None;
        }
        let mut action = format!("{verb} {resource}");
        if !group.is_empty() {
            action.push('.');
            action.push_str(group);
        }
        if let Some(sub) = subresource {
            action.push('/');
            action.push_str(sub);
        }
        let object = match (namespace, name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.to_string(),
            (Some(ns), None) => ns.to_string(),
            (None, None) => String::new(),
        };
        Some(Self { action, object })
    }
}

/// The dry-run state of a process: the counter of the writes it did not make.
#[derive(Debug, Clone)]
pub struct DryRun {
    /// `cloud_controller_manager_dry_run_actions_total{controller, action}`; register it with
    /// [`crate::metrics::Metrics::register`].
    pub actions: IntCounterVec,
}

impl Default for DryRun {
    fn default() -> Self {
        Self::new()
    }
}

impl DryRun {
    /// A new, unregistered counter.
    pub fn new() -> Self {
        Self {
            actions: IntCounterVec::new(
                Opts::new(
                    DRY_RUN_ACTIONS_TOTAL,
                    "Writes (to the API server or the cloud) that the controller manager would have made, had it not run with --dry-run",
                ),
                &["controller", "action"],
            )
            .expect("valid metric"),
        }
    }

    /// Records one write not made: one `info` line and one count.
    pub fn record(&self, controller: &str, action: &str, object: &str) {
        self.actions.with_label_values(&[controller, action]).inc();
        info!(dry_run = true, controller, action, object, "dry run: would write");
    }
}

/// Tower layer over a Kubernetes client's requests: logs writes, and in dry-run mode turns
/// them into server-side dry runs (see the module docs).
#[derive(Debug, Clone)]
pub struct WriteLayer {
    controller: Arc<str>,
    dry_run: Option<DryRun>,
}

impl WriteLayer {
    /// A layer for the client of `controller` (its client name, e.g. `node-controller`);
    /// `dry_run` switches dry-run mode on.
    pub fn new(controller: &str, dry_run: Option<DryRun>) -> Self {
        Self {
            controller: controller.into(),
            dry_run,
        }
    }
}

impl<S> Layer<S> for WriteLayer {
    type Service = Writes<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Writes {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`WriteLayer`].
#[derive(Debug, Clone)]
pub struct Writes<S> {
    inner: S,
    layer: WriteLayer,
}

/// `uri` with `dryRun=All` added to its query.
fn with_dry_run(uri: &http::Uri) -> Option<http::Uri> {
    let mut parts = uri.clone().into_parts();
    let pq = parts.path_and_query.as_ref()?;
    let new = match pq.query() {
        Some(q) if !q.is_empty() => format!("{}?{q}&dryRun=All", pq.path()),
        _ => format!("{}?dryRun=All", pq.path()),
    };
    parts.path_and_query = Some(new.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// The body of a dry-run DELETE: the caller's `DeleteOptions` with `dryRun: ["All"]`. The API
/// server reads a DELETE's options from its body whenever there is one, ignoring the query, so
/// the query parameter alone would let the deletion happen. `None` when the body cannot be read
/// at once or is not a JSON object.
fn dry_run_delete_options(body: kube::client::Body) -> Option<Vec<u8>> {
    use futures::FutureExt as _;
    let bytes = body.collect_bytes().now_or_never()?.ok()?;
    let mut options: serde_json::Value = if bytes.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_slice(&bytes).ok()?
    };
    options
        .as_object_mut()?
        .insert("dryRun".into(), serde_json::json!(["All"]));
    serde_json::to_vec(&options).ok()
}

/// Where a write that cannot be made a dry run is sent instead: a path the API server answers
/// with 404, so it is never carried out.
const REFUSED: &str = "/dry-run-refused";

impl<S> Service<http::Request<kube::client::Body>> for Writes<S>
where
    S: Service<http::Request<kube::client::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<kube::client::Body>) -> Self::Future {
        if let Some(write) = Action::of_request(req.method(), req.uri().path()) {
            let controller = &*self.layer.controller;
            match &self.layer.dry_run {
                Some(dry_run) => {
                    // A write we cannot turn into a dry run is never sent as a real one.
                    let mut uri = with_dry_run(req.uri());
                    if req.method() == http::Method::DELETE {
                        let body = std::mem::replace(req.body_mut(), kube::client::Body::empty());
                        match dry_run_delete_options(body) {
                            Some(options) => *req.body_mut() = options.into(),
                            None => uri = None,
                        }
                    }
                    *req.uri_mut() = uri.unwrap_or_else(|| http::Uri::from_static(REFUSED));
                    dry_run.record(controller, &write.action, &write.object);
                }
                None => debug!(
                    dry_run = false,
                    controller,
                    action = %write.action,
                    object = %write.object,
                    "write"
                ),
            }
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(method: http::Method, path: &str) -> Option<(String, String)> {
        Action::of_request(&method, path).map(|a| (a.action, a.object))
    }

    #[test]
    fn writes_are_named_by_verb_resource_and_object() {
        let s = |a: &str, o: &str| Some((a.to_string(), o.to_string()));
        assert_eq!(
            action(http::Method::PATCH, "/api/v1/nodes/n1"),
            s("patch nodes", "n1")
        );
        assert_eq!(
            action(http::Method::PATCH, "/api/v1/nodes/n1/status"),
            s("patch nodes/status", "n1")
        );
        assert_eq!(
            action(http::Method::DELETE, "/api/v1/nodes/n1"),
            s("delete nodes", "n1")
        );
        assert_eq!(
            action(
                http::Method::PATCH,
                "/api/v1/namespaces/default/services/web/status"
            ),
            s("patch services/status", "default/web")
        );
        assert_eq!(
            action(http::Method::POST, "/api/v1/namespaces/default/events"),
            s("create events", "default")
        );
        assert_eq!(
            action(
                http::Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/cloud-controller-manager"
            ),
            s(
                "update leases.coordination.k8s.io",
                "kube-system/cloud-controller-manager"
            )
        );
        assert_eq!(
            action(http::Method::POST, "/api/v1/namespaces"),
            s("create namespaces", "")
        );
        assert_eq!(action(http::Method::GET, "/api/v1/nodes"), None);
        assert_eq!(
            action(http::Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews"),
            None
        );
        assert_eq!(
            action(
                http::Method::POST,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews"
            ),
            None
        );
        assert_eq!(
            action(
                http::Method::POST,
                "/api/v1/namespaces/kube-system/serviceaccounts/node-controller/token"
            ),
            None
        );
    }

    #[test]
    fn dry_run_is_added_to_the_query() {
        let u: http::Uri = "/api/v1/nodes/n1?fieldManager=ccm".parse().unwrap();
        assert_eq!(
            with_dry_run(&u).unwrap().to_string(),
            "/api/v1/nodes/n1?fieldManager=ccm&dryRun=All"
        );
        let u: http::Uri = "https://127.0.0.1:6443/api/v1/nodes/n1".parse().unwrap();
        assert_eq!(
            with_dry_run(&u).unwrap().to_string(),
            "https://127.0.0.1:6443/api/v1/nodes/n1?dryRun=All"
        );
    }

    #[test]
    fn dry_run_requests_carry_the_parameter_and_are_counted() {
        use std::future::{Ready, ready};
        #[derive(Clone)]
        struct Echo;
        impl Service<http::Request<kube::client::Body>> for Echo {
            type Response = String;
            type Error = std::convert::Infallible;
            type Future = Ready<Result<String, std::convert::Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
                use futures::FutureExt as _;
                let (parts, body) = req.into_parts();
                let body = body.collect_bytes().now_or_never().unwrap().unwrap();
                let body = String::from_utf8_lossy(&body);
                ready(Ok(if body.is_empty() {
                    parts.uri.to_string()
                } else {
                    format!("{} {body}", parts.uri)
                }))
            }
        }
        let dry_run = DryRun::new();
        let mut svc = WriteLayer::new("node-controller", Some(dry_run.clone())).layer(Echo);
        let call_with = |svc: &mut Writes<Echo>, m: http::Method, p: &str, body: &str| {
            let req = http::Request::builder()
                .method(m)
                .uri(p)
                .body(kube::client::Body::from(body.as_bytes().to_vec()))
                .unwrap();
            futures::executor::block_on(svc.call(req)).unwrap()
        };
        let call = |svc: &mut Writes<Echo>, m: http::Method, p: &str| call_with(svc, m, p, "");
        assert_eq!(
            call(&mut svc, http::Method::PATCH, "/api/v1/nodes/n1"),
            "/api/v1/nodes/n1?dryRun=All"
        );
        assert_eq!(
            call(&mut svc, http::Method::GET, "/api/v1/nodes"),
            "/api/v1/nodes"
        );
        // A DELETE's options are read from its body when it has one: dryRun goes there too.
        assert_eq!(
            call_with(
                &mut svc,
                http::Method::DELETE,
                "/api/v1/nodes/n1",
                r#"{"propagationPolicy":"Background"}"#
            ),
            r#"/api/v1/nodes/n1?dryRun=All {"dryRun":["All"],"propagationPolicy":"Background"}"#
        );
        assert_eq!(
            call(&mut svc, http::Method::DELETE, "/api/v1/nodes/n1"),
            r#"/api/v1/nodes/n1?dryRun=All {"dryRun":["All"]}"#
        );
        // Options that are not a JSON object: the deletion is sent nowhere it could happen.
        assert_eq!(
            call_with(&mut svc, http::Method::DELETE, "/api/v1/nodes/n1", "[1]"),
            "/dry-run-refused"
        );
        assert_eq!(
            dry_run
                .actions
                .with_label_values(&["node-controller", "patch nodes"])
                .get(),
            1
        );
        let mut normal = WriteLayer::new("node-controller", None).layer(Echo);
        assert_eq!(
            call(&mut normal, http::Method::PATCH, "/api/v1/nodes/n1"),
            "/api/v1/nodes/n1"
        );
    }
}
