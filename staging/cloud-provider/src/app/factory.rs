//! What a provider's factory is given: upstream's `InitCloudFunc` gets the completed
//! configuration, and a provider's `main` (cloud-provider-gcp's) reads flags of its own; here
//! the factory gets a [`FactoryContext`] with the cloud config, the cluster name, the parsed
//! command line (provider flags added with [`super::ProviderSpec::with_flags`] included) and a
//! way to build Kubernetes clients.

use std::{future::Future, path::PathBuf, sync::Arc};

use crate::{
    cloud::CloudProvider,
    error::BoxError,
    registry::{Factory, FactoryFuture},
};

/// What the provider's factory is given at start-up (`#[non_exhaustive]`: fields may be added
/// in a minor release).
#[derive(Clone)]
#[non_exhaustive]
pub struct FactoryContext {
    /// The contents of the `--cloud-config` file (`None` without the flag).
    pub config: Option<Vec<u8>>,
    /// `--cloud-config` (`None` without the flag).
    pub config_path: Option<PathBuf>,
    /// `--cluster-name`.
    pub cluster_name: String,
    /// The parsed command line: the CCM's flags and the provider's own
    /// ([`FactoryContext::flags`] reads them).
    pub matches: clap::ArgMatches,
    kube: Option<(kube::Config, f32, u32)>,
}

impl std::fmt::Debug for FactoryContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FactoryContext")
            .field("config_path", &self.config_path)
            .field("cluster_name", &self.cluster_name)
            .finish_non_exhaustive()
    }
}

impl FactoryContext {
    /// A context with the cloud config `config` and nothing else (for tests, and for a factory
    /// called outside the command).
    pub fn new(config: Option<Vec<u8>>) -> Self {
        Self {
            config,
            config_path: None,
            cluster_name: "kubernetes".into(),
            matches: clap::ArgMatches::default(),
            kube: None,
        }
    }

    /// Sets [`FactoryContext::cluster_name`].
    pub fn with_cluster_name(mut self, name: impl Into<String>) -> Self {
        self.cluster_name = name.into();
        self
    }

    /// Sets the parsed command line.
    pub fn with_matches(mut self, matches: clap::ArgMatches) -> Self {
        self.matches = matches;
        self
    }

    /// Sets the Kubernetes configuration [`FactoryContext::client`] builds clients from, with
    /// `--kube-api-qps` and `--kube-api-burst`.
    pub fn with_kube_config(mut self, config: kube::Config, qps: f32, burst: u32) -> Self {
        self.kube = Some((config, qps, burst));
        self
    }

    /// The provider's flags (a `clap::Args` derive added with
    /// [`super::ProviderSpec::with_flags`]), read from the command line; the error names the
    /// flag.
    pub fn flags<T: clap::FromArgMatches>(&self) -> Result<T, String> {
        T::from_arg_matches(&self.matches).map_err(|e| e.to_string().trim().to_string())
    }

    /// A Kubernetes client as the CCM's own (its kubeconfig or in-cluster configuration, its
    /// QPS and burst), with the user agent `cloud-controller-manager/<user_agent>`: for a
    /// provider that reads Secrets or ConfigMaps while it starts.
    pub fn client(&self, user_agent: &str) -> Result<kube::Client, String> {
        let Some((config, qps, burst)) = &self.kube else {
            return Err("no Kubernetes configuration was given to the factory".into());
        };
        k8s_controller_manager::client::build_client(config.clone(), *qps, *burst, user_agent)
            .map_err(|e| e.to_string())
    }
}

/// A factory given a [`FactoryContext`].
pub type ContextFactory = Arc<dyn Fn(FactoryContext) -> FactoryFuture + Send + Sync>;

/// What [`super::ProviderSpec::new`] takes as the factory: a closure
/// `|ctx: FactoryContext| async move { … }` returning `Result<P, E>` for any
/// [`CloudProvider`] `P` and error `E`, or a [`Factory`] (given only the cloud config).
pub trait IntoFactory {
    /// The factory.
    fn into_factory(self) -> ContextFactory;
}

impl IntoFactory for Factory {
    fn into_factory(self) -> ContextFactory {
        Arc::new(move |ctx: FactoryContext| (self)(ctx.config))
    }
}

impl IntoFactory for ContextFactory {
    fn into_factory(self) -> ContextFactory {
        self
    }
}

/// A closure factory (see [`IntoFactory`]).
pub fn from_fn<F, Fut, P, E>(f: F) -> ContextFactory
where
    F: Fn(FactoryContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<P, E>> + Send + 'static,
    P: CloudProvider + 'static,
    E: Into<BoxError>,
{
    Arc::new(move |ctx| {
        let fut = f(ctx);
        Box::pin(async move {
            fut.await
                .map(|p| Arc::new(p) as Arc<dyn CloudProvider>)
                .map_err(Into::into)
        })
    })
}

impl<F, Fut, P, E> IntoFactory for F
where
    F: Fn(FactoryContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<P, E>> + Send + 'static,
    P: CloudProvider + 'static,
    E: Into<BoxError>,
{
    fn into_factory(self) -> ContextFactory {
        from_fn(self)
    }
}
