//! AWS load balancers: `cloud-controller-manager-aws` as a real process on kube-apiserver and
//! moto, asserted on the moto resources, split along the concepts: Classic ELBs, NLBs,
//! security groups, and answers altered by a fault proxy.

mod classic;
mod env;
mod faults;
mod nlb;
mod security_groups;
