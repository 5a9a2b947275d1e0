//! Commands of `cloud-controller-manager-aws` besides running the controllers.

pub mod doctor;
pub mod orphans;
