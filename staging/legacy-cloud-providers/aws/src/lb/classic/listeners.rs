//! A Classic ELB's listeners (AWS-34): TCP/HTTP, TLS by `ssl-cert`/`ssl-ports`/
//! `backend-protocol`; changed by deleting and re-creating the ports that differ.

use super::*;

/// One wanted listener.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListenerSpec {
    /// Front-end protocol.
    pub protocol: String,
    /// Load balancer port.
    pub port: i32,
    /// Back-end protocol.
    pub instance_protocol: String,
    /// NodePort.
    pub instance_port: i32,
    /// Certificate ARN for SSL/HTTPS.
    pub certificate: Option<String>,
}

/// The listeners of AWS-34.
pub fn listeners(ports: &[LbPort], opts: &LbOptions) -> Result<Vec<ListenerSpec>, CloudError> {
    let backend = opts.backend_protocol.as_deref();
    ports
        .iter()
        .map(|p| {
            let (fe, be) = if opts.is_ssl_port(p.port, p.name.as_deref()) {
                match backend {
                    None | Some("tcp") => ("SSL", "TCP"),
                    Some("http") => ("HTTPS", "HTTP"),
                    Some("https") => ("HTTPS", "HTTPS"),
                    Some("ssl") => ("SSL", "SSL"),
                    Some(other) => {
                        return Err(CloudError::msg(format!(
                            "backend-protocol {other:?} is not supported"
                        )));
                    }
                }
            } else if backend == Some("http") {
                ("HTTP", "HTTP")
            } else {
                ("TCP", "TCP")
            };
            Ok(ListenerSpec {
                protocol: fe.into(),
                port: p.port,
                instance_protocol: be.into(),
                instance_port: p.node_port,
                certificate: matches!(fe, "SSL" | "HTTPS")
                    .then(|| opts.ssl_cert.clone())
                    .flatten(),
            })
        })
        .collect()
}

pub(crate) fn spec_of(l: &Listener) -> ListenerSpec {
    ListenerSpec {
        protocol: l.protocol().to_ascii_uppercase(),
        port: l.load_balancer_port(),
        instance_protocol: l.instance_protocol().unwrap_or(l.protocol()).to_ascii_uppercase(),
        instance_port: l.instance_port(),
        certificate: l.ssl_certificate_id().map(str::to_string),
    }
}

pub(crate) fn same_listener(a: &ListenerSpec, b: &ListenerSpec) -> bool {
    a.port == b.port
        && a.instance_port == b.instance_port
        && a.protocol.eq_ignore_ascii_case(&b.protocol)
        && a.instance_protocol.eq_ignore_ascii_case(&b.instance_protocol)
        && a.certificate.as_deref().map(str::to_ascii_lowercase)
            == b.certificate.as_deref().map(str::to_ascii_lowercase)
}

pub(crate) fn to_listener(l: &ListenerSpec) -> Result<Listener, CloudError> {
    Listener::builder()
        .protocol(&l.protocol)
        .load_balancer_port(l.port)
        .instance_protocol(&l.instance_protocol)
        .instance_port(l.instance_port)
        .set_ssl_certificate_id(l.certificate.clone())
        .build()
        .map_err(|e| CloudError::msg(format!("listener {}: {e}", l.port)))
}

impl AwsCloud {
    pub(crate) async fn sync_classic_listeners(
        &self,
        name: &str,
        lb: &LoadBalancerDescription,
        wanted: &[ListenerSpec],
    ) -> CloudResult<()> {
        let have: Vec<ListenerSpec> = lb
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener())
            .map(spec_of)
            .collect();
        let remove: Vec<i32> = have
            .iter()
            .filter(|h| !wanted.iter().any(|w| same_listener(w, h)))
            .map(|h| h.port)
            .collect();
        let add: Vec<&ListenerSpec> = wanted
            .iter()
            .filter(|w| !have.iter().any(|h| same_listener(w, h)))
            .collect();
        if !remove.is_empty() {
            self.api
                .call(
                    "elb_delete_listeners",
                    self.elb
                        .delete_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_load_balancer_ports(Some(remove))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deleting listeners of {name}"), e))?;
        }
        if !add.is_empty() {
            let listeners = add.into_iter().map(to_listener).collect::<Result<Vec<_>, _>>()?;
            self.api
                .call(
                    "elb_create_listeners",
                    self.elb
                        .create_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_listeners(Some(listeners))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("creating listeners of {name}"), e))?;
        }
        Ok(())
    }
}
