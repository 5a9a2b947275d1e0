//! Octavia load balancers of `cloud-controller-manager-openstack` in the states and with the
//! floating IPs of a real cloud (`hack/openstack.sh`), split along the concepts: floating IPs,
//! Octavia's states, shadow mode and orphans, annotations, adoption from OCCM, and load
//! balancers shared between Services.

mod adoption;
mod annotations;
mod defaults;
mod dual_stack;
mod env;
mod floating_ips;
mod networks;
mod safety;
mod security_groups;
mod sharing;
mod states;
mod tls;
mod write_back;
