//! A node's addresses from its VM's guest NICs (VS-10): the configured networks, subnets and
//! exclusions, IPv4/IPv6 per the IP families.

use super::*;

pub(crate) fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_loopback() || v4.is_link_local() || v4.is_multicast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_unicast_link_local()
                || (v6.is_multicast() && (v6.segments()[0] & 0x000f) == 2))
        }
    }
}

/// Node addresses by VS-08…10; `static_first` are the IPs cloud-init configured statically
/// (VS-09, [`guestinfo::static_addresses`]): among the candidates they come first, in their
/// order, the others keep theirs.
pub fn node_addresses(
    host_name: &str,
    nics: &[GuestNicInfo],
    nodes: &NodesConfig,
    families: &[String],
    static_first: &[IpAddr],
) -> Result<Vec<NodeAddress>, String> {
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |t: &str, a: &str| {
        let n = NodeAddress {
            type_: t.into(),
            address: a.into(),
        };
        if !out.contains(&n) {
            out.push(n);
        }
    };
    if !host_name.is_empty() {
        push("Hostname", host_name);
    }
    let candidates: Vec<(IpAddr, &str)> = nics
        .iter()
        .filter(|n| n.device_config_id != -1)
        .flat_map(|n| {
            n.ip_addresses
                .iter()
                .filter_map(move |ip| ip.parse::<IpAddr>().ok().map(|a| (a, n.network.as_str())))
        })
        .filter(|(ip, _)| usable(ip))
        .collect();
    let mut candidates = candidates;
    candidates.sort_by_key(|(ip, _)| static_first.iter().position(|s| s == ip).unwrap_or(usize::MAX));
    if !nodes.internal_vm_network_name.is_empty() && !nodes.external_vm_network_name.is_empty() {
        let has = |name: &str| nics.iter().any(|n| n.network.eq_ignore_ascii_case(name));
        if !has(&nodes.internal_vm_network_name) && !has(&nodes.external_vm_network_name) {
            return Err(format!(
                "neither network {:?} nor {:?} is attached to the VM",
                nodes.internal_vm_network_name, nodes.external_vm_network_name
            ));
        }
    }
    for family in families {
        let v4 = family == "ipv4";
        let fam: Vec<&(IpAddr, &str)> = candidates.iter().filter(|(ip, _)| ip.is_ipv4() == v4).collect();
        let outside = |excl: &[IpNet], ip: &IpAddr| !excl.iter().any(|c| c.contains(ip));
        let internal: Vec<&&(IpAddr, &str)> = fam
            .iter()
            .filter(|(ip, _)| outside(&nodes.exclude_internal_network_subnet_cidr, ip))
            .collect();
        let external: Vec<&&(IpAddr, &str)> = fam
            .iter()
            .filter(|(ip, _)| outside(&nodes.exclude_external_network_subnet_cidr, ip))
            .collect();
        let pick = |list: &[&&(IpAddr, &str)], cidrs: &[IpNet], network: &str| -> Option<IpAddr> {
            list.iter()
                .find(|(ip, _)| cidrs.iter().any(|c| c.contains(ip)))
                .or_else(|| {
                    (!network.is_empty())
                        .then(|| list.iter().find(|(_, n)| n.eq_ignore_ascii_case(network)))
                        .flatten()
                })
                .map(|(ip, _)| *ip)
        };
        let mut int_ip = pick(
            &internal,
            &nodes.internal_network_subnet_cidr,
            &nodes.internal_vm_network_name,
        );
        let mut ext_ip = pick(
            &external,
            &nodes.external_network_subnet_cidr,
            &nodes.external_vm_network_name,
        );
        if int_ip.is_none() && ext_ip.is_none() {
            // The legacy default: the first candidate of each type, each from its own list,
            // so that an address excluded for one type never becomes that type.
            int_ip = internal.first().map(|(ip, _)| *ip);
            ext_ip = external.first().map(|(ip, _)| *ip);
        }
        if int_ip.is_none() && ext_ip.is_none() {
            return Err(format!("unable to find suitable IP address for node ({family})"));
        }
        if let Some(ip) = int_ip {
            push("InternalIP", &ip.to_string());
        }
        if let Some(ip) = ext_ip {
            push("ExternalIP", &ip.to_string());
        }
    }
    Ok(out)
}
