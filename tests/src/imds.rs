//! A small EC2 instance-metadata (IMDSv2) server on 127.0.0.1 for one instance of a moto
//! [`crate::moto::World`]: moto answers IMDS paths with fixed values unrelated to its instances,
//! so tests of start-up paths that ask IMDS (region, self instance, VPC) run against this one.
//!
//! It answers `PUT /latest/api/token` and, with that token, `GET` of the identity document,
//! `instance-id`, `placement/availability-zone`, `placement/region`, `local-ipv4`, `mac` and the
//! MAC's `vpc-id`/`subnet-id`; everything else is 404. Every request is counted by path.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::moto::{Instance, REGION, World};

const TOKEN: &str = "rcp-e2e-imds-token";

/// What the stub tells about "the instance the CCM runs on".
#[derive(Debug, Clone)]
pub struct SelfInstance {
    /// `i-…`
    pub instance_id: String,
    /// Availability zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// Primary private IPv4 address.
    pub private_ip: String,
    /// VPC.
    pub vpc_id: String,
    /// Subnet.
    pub subnet_id: String,
}

impl SelfInstance {
    /// `instance` of `world`, in [`REGION`].
    pub fn of(world: &World, instance: &Instance) -> Self {
        let subnet_id = world
            .subnets
            .iter()
            .find(|(zone, _)| *zone == instance.zone)
            .map(|(_, id)| id.clone())
            .unwrap_or_default();
        Self {
            instance_id: instance.id.clone(),
            zone: instance.zone.clone(),
            region: REGION.to_string(),
            private_ip: instance.private_ip.clone(),
            vpc_id: world.vpc_id.clone(),
            subnet_id,
        }
    }
}

/// A running IMDS stub; stops when dropped.
pub struct ImdsStub {
    addr: SocketAddr,
    requests: Arc<Mutex<BTreeMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ImdsStub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImdsStub").field("addr", &self.addr).finish()
    }
}

impl Drop for ImdsStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const MAC: &str = "0e:00:00:00:00:01";

fn answer(
    me: &SelfInstance,
    method: &hyper::Method,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, String) {
    if path == "/latest/api/token" {
        return if method == hyper::Method::PUT {
            (StatusCode::OK, TOKEN.to_string())
        } else {
            (StatusCode::METHOD_NOT_ALLOWED, String::new())
        };
    }
    if token != Some(TOKEN) {
        return (StatusCode::UNAUTHORIZED, String::new());
    }
    let mac_prefix = format!("/latest/meta-data/network/interfaces/macs/{MAC}/");
    let body = match path {
        "/latest/dynamic/instance-identity/document" => serde_json::json!({
            "accountId": "123456789012",
            "architecture": "x86_64",
            "availabilityZone": me.zone,
            "imageId": "ami-12345678",
            "instanceId": me.instance_id,
            "instanceType": "t3.medium",
            "privateIp": me.private_ip,
            "region": me.region,
            "version": "2017-09-30",
        })
        .to_string(),
        "/latest/meta-data/instance-id" => me.instance_id.clone(),
        "/latest/meta-data/placement/availability-zone" => me.zone.clone(),
        "/latest/meta-data/placement/region" => me.region.clone(),
        "/latest/meta-data/local-ipv4" => me.private_ip.clone(),
        "/latest/meta-data/mac" => MAC.to_string(),
        p if p.strip_prefix(&mac_prefix) == Some("vpc-id") => me.vpc_id.clone(),
        p if p.strip_prefix(&mac_prefix) == Some("subnet-id") => me.subnet_id.clone(),
        _ => return (StatusCode::NOT_FOUND, String::new()),
    };
    (StatusCode::OK, body)
}

impl ImdsStub {
    /// Starts the stub on a free port of 127.0.0.1.
    pub async fn start(me: SelfInstance) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let counts = requests.clone();
        let me = Arc::new(me);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = me.clone();
                let counts = counts.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let path = req.uri().path().to_string();
                        *counts
                            .lock()
                            .expect("imds counter")
                            .entry(path.clone())
                            .or_default() += 1;
                        let token = req
                            .headers()
                            .get("x-aws-ec2-metadata-token")
                            .and_then(|v| v.to_str().ok());
                        let (status, body) = answer(&me, req.method(), &path, token);
                        let mut resp = Response::new(Full::new(Bytes::from(body)));
                        *resp.status_mut() = status;
                        if path == "/latest/api/token" {
                            resp.headers_mut().insert(
                                "x-aws-ec2-metadata-token-ttl-seconds",
                                http::HeaderValue::from_static("21600"),
                            );
                        }
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, requests, task })
    }

    /// `http://127.0.0.1:<port>`: the value for `AWS_EC2_METADATA_SERVICE_ENDPOINT` or an
    /// `ec2imds` override.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests each path got.
    pub fn requests(&self) -> BTreeMap<String, usize> {
        self.requests.lock().expect("imds counter").clone()
    }
}
