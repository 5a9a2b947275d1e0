//! A controller of the sample's own, as a vendor adds one to the framework's four: it reports
//! how many addresses of the load-balancer pool Services hold (`sample_address_pool_held` on
//! `/metrics`), every `--pool-usage-interval`. It is one of the command's controllers in every
//! respect: `--controllers` (`pool-usage`, on by default with `*`), its own `--help` section,
//! its own client name, a health check, leader election and supervision.

use std::{sync::Arc, time::Duration};

use k8s_cloud_provider::app::{ProviderController, ProviderControllerStart};

use crate::provider::SampleCloud;

/// The controller's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Pool usage controller flags")]
pub struct PoolUsageFlags {
    /// How often the pool's usage is reported (a Go duration).
    #[arg(long = "pool-usage-interval", default_value = "10s", value_parser = parse_interval)]
    pub interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = k8s_cloud_provider::k8s_controller_manager::duration::parse_go_duration(s)?;
    if d.is_zero() {
        return Err("must be more than 0s".into());
    }
    Ok(d)
}

/// The controller as the sample registers it.
pub fn provider_controller() -> ProviderController {
    ProviderController::new("pool-usage", "pool-usage-controller", |matches| {
        let flags = <PoolUsageFlags as clap::FromArgMatches>::from_arg_matches(matches)
            .map_err(|e| format!("pool usage controller flags: {e}"))?;
        let start: ProviderControllerStart = Arc::new(move |ctx| {
            let interval = flags.interval;
            Ok(tokio::spawn(async move {
                loop {
                    // The framework's context reaches the sample's own provider (through the
                    // wrapper that audits cloud writes).
                    if let Some(pool) = ctx
                        .provider::<SampleCloud>()
                        .and_then(|cloud| cloud.load_balancers.as_ref().map(|p| (cloud, p)))
                    {
                        let (cloud, pool) = pool;
                        cloud.pool_held.set(pool.held() as i64);
                    }
                    tokio::time::sleep(interval).await;
                }
            }))
        });
        Ok(start)
    })
    .with_flags(<PoolUsageFlags as clap::Args>::augment_args)
}
