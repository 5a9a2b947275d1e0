//! Commands of `cloud-controller-manager-aws` besides running the controllers.

pub mod orphans;
