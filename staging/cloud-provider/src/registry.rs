//! The provider registry (upstream `plugins.go`): provider name → factory.
//!
//! A binary normally passes its one factory straight to [`crate::app::run`]; the registry is
//! for programs that choose the provider at run time by `--cloud-provider`.

use std::{
    collections::BTreeMap,
    future::Future,
    path::Path,
    pin::Pin,
    sync::{Arc, LazyLock},
};

use parking_lot::Mutex;

use crate::{cloud::CloudProvider, error::BoxError};

/// The future a factory returns.
pub type FactoryFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn CloudProvider>, BoxError>> + Send>>;

/// Builds a provider from the contents of the cloud-config file (`None` without
/// `--cloud-config`). The format of the file is the provider's (INI, YAML, …).
pub type Factory = Arc<dyn Fn(Option<Vec<u8>>) -> FactoryFuture + Send + Sync>;

/// Registry errors.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A provider name registered twice (a programming error; upstream exits).
    #[error("Cloud provider {0:?} was registered twice")]
    Duplicate(String),
    /// The cloud-config file could not be read.
    #[error("couldn't open cloud provider configuration {path}: {source}")]
    ConfigFile {
        /// The `--cloud-config` path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The factory failed (bad config, unreachable cloud, …).
    #[error("could not init cloud provider {name:?}: {source}")]
    Init {
        /// The provider name.
        name: String,
        /// The factory's error.
        #[source]
        source: BoxError,
    },
    /// No provider of this name is registered.
    #[error("unknown cloud provider {0:?}")]
    Unknown(String),
}

/// A set of named provider factories.
#[derive(Default)]
pub struct ProviderRegistry {
    factories: Mutex<BTreeMap<String, Factory>>,
}

impl std::fmt::Debug for ProviderRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderRegistry")
            .field("providers", &self.names())
            .finish()
    }
}

static GLOBAL: LazyLock<ProviderRegistry> = LazyLock::new(ProviderRegistry::default);

impl ProviderRegistry {
    /// The process-global registry.
    pub fn global() -> &'static ProviderRegistry {
        &GLOBAL
    }

    /// Registers `factory` under `name`; a second registration of the same name is an error.
    pub fn register(&self, name: &str, factory: Factory) -> Result<(), RegistryError> {
        let mut map = self.factories.lock();
        if map.contains_key(name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        tracing::info!(provider = name, "Registered cloud provider");
        map.insert(name.to_string(), factory);
        Ok(())
    }

    /// Whether `name` is registered.
    pub fn is_registered(&self, name: &str) -> bool {
        self.factories.lock().contains_key(name)
    }

    /// Registered names.
    pub fn names(&self) -> Vec<String> {
        self.factories.lock().keys().cloned().collect()
    }

    /// Upstream `InitCloudProvider`: `""` and `"external"` give `Ok(None)`; otherwise reads the
    /// config file (if a path is given) and calls the factory.
    pub async fn init(
        &self,
        name: &str,
        config_path: Option<&Path>,
    ) -> Result<Option<Arc<dyn CloudProvider>>, RegistryError> {
        if name.is_empty() {
            return Ok(None);
        }
        if is_external(name) {
            tracing::info!("External cloud provider specified");
            return Ok(None);
        }
        let factory = self
            .factories
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| RegistryError::Unknown(name.to_string()))?;
        let config = read_config(config_path)?;
        factory(config)
            .await
            .map(Some)
            .map_err(|source| RegistryError::Init {
                name: name.to_string(),
                source,
            })
    }
}

/// Reads the cloud-config file, if a path is given.
pub fn read_config(config_path: Option<&Path>) -> Result<Option<Vec<u8>>, RegistryError> {
    match config_path {
        None => Ok(None),
        Some(p) if p.as_os_str().is_empty() => Ok(None),
        Some(p) => std::fs::read(p)
            .map(Some)
            .map_err(|source| RegistryError::ConfigFile {
                path: p.display().to_string(),
                source,
            }),
    }
}

/// Whether `name` means "the cloud provider runs elsewhere" (`external`).
pub fn is_external(name: &str) -> bool {
    name == "external"
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(String);
    impl CloudProvider for Named {
        fn provider_name(&self) -> &str {
            &self.0
        }
    }

    fn factory() -> Factory {
        Arc::new(|config: Option<Vec<u8>>| {
            Box::pin(async move {
                let name = match config {
                    Some(bytes) => String::from_utf8(bytes)?,
                    None => "unconfigured".into(),
                };
                Ok(Arc::new(Named(name)) as Arc<dyn CloudProvider>)
            })
        })
    }

    #[tokio::test]
    async fn init_follows_upstream_rules() {
        let r = ProviderRegistry::default();
        r.register("fake", factory()).unwrap();
        assert!(matches!(r.register("fake", factory()), Err(RegistryError::Duplicate(n)) if n == "fake"));
        assert!(r.init("", None).await.unwrap().is_none());
        assert!(r.init("external", None).await.unwrap().is_none());
        assert_eq!(
            r.init("fake", None).await.unwrap().unwrap().provider_name(),
            "unconfigured"
        );
        let e = r.init("nope", None).await.err().unwrap().to_string();
        assert_eq!(e, "unknown cloud provider \"nope\"");
        let e = r
            .init("fake", Some(Path::new("/nonexistent/cloud.conf")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("couldn't open cloud provider configuration /nonexistent/cloud.conf"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.conf");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        let e = r.init("fake", Some(&p)).await.err().unwrap().to_string();
        assert!(e.starts_with("could not init cloud provider \"fake\""), "{e}");
    }
}
