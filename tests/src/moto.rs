//! `Moto`: moto's AWS emulator (EC2, ELB, ELBv2) on a random port of 127.0.0.1, and `World`, a
//! cluster-shaped VPC built in it with the real AWS SDK.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_ec2::{
    Client as Ec2,
    config::{BehaviorVersion, Credentials, Region},
    types::{Filter, InstanceType, ResourceType, Tag, TagSpecification},
};
use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::{
    paths,
    process::{ManagedProcess, free_port},
};

/// The region every test world lives in.
pub const REGION: &str = "us-east-1";
/// The two availability zones a [`World`] spreads its subnets and instances over.
pub const ZONES: [&str; 2] = ["us-east-1a", "us-east-1b"];

/// A running moto server. Any credentials are accepted; requests are routed by their SigV4
/// credential scope.
pub struct Moto {
    process: ManagedProcess,
    endpoint: String,
    dir: TempDir,
}

impl std::fmt::Debug for Moto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moto")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// With `RCP_AWS_CALLS_DIR` set (hack/test.sh sets it), a stopped moto leaves there the IAM
/// actions of the requests this project's programs made ([`Moto::iam_calls`]), one
/// `<application> <action>` line each: hack/verify-iam-calls.sh checks the whole suite's
/// against the shipped IAM policies.
impl Drop for Moto {
    fn drop(&mut self) {
        let Some(dir) = std::env::var_os("RCP_AWS_CALLS_DIR") else {
            return;
        };
        let lines: Vec<String> = self
            .iam_calls()
            .into_iter()
            .map(|(app, action)| format!("{app} {action}\n"))
            .collect();
        let file =
            std::path::Path::new(&dir).join(format!("moto-{}-{}.calls", std::process::id(), self.port()));
        if let Err(e) = std::fs::write(&file, lines.concat()) {
            eprintln!("could not write {}: {e}", file.display());
        }
    }
}

impl Moto {
    /// Starts moto and waits until it answers.
    pub async fn start() -> Result<Self> {
        crate::init();
        let bin = paths::test_bin("moto_server")?;
        let dir = tempfile::Builder::new().prefix("rcp-moto-").tempdir()?;
        let port = free_port();
        let recording = dir.path().join("recording.jsonl");
        let process = ManagedProcess::spawn(
            "moto",
            &bin,
            &["-H".into(), "127.0.0.1".into(), "-p".into(), port.to_string()],
            // moto's recorder: every request (with its body) as one JSON line, our request log.
            &[
                ("MOTO_ENABLE_RECORDING".into(), "True".into()),
                ("MOTO_RECORDER_FILEPATH".into(), recording.display().to_string()),
            ],
            &dir.path().join("moto.log"),
            Signal::SIGTERM,
        )?;
        let mut moto = Self {
            process,
            endpoint: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            moto.process.check_running()?;
            if let Ok(r) = http.get(format!("{}/moto-api/", moto.endpoint)).send().await
                && r.status().is_success()
            {
                return Ok(moto);
            }
            if Instant::now() > deadline {
                bail!("moto did not answer within 30 s:\n{}", moto.process.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The endpoint URL (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.endpoint
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_default()
    }

    /// The moto log so far (one line per request).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Every request moto received so far, in order, from moto's recorder: its headers and
    /// its body (query protocol: `Action=CreateTargetGroup&Name=…`).
    pub fn recorded(&self) -> Vec<(BTreeMap<String, String>, String)> {
        use base64::Engine as _;
        let Ok(text) = std::fs::read_to_string(self.dir.path().join("recording.jsonl")) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| {
                let entry: serde_json::Value = serde_json::from_str(line).ok()?;
                let body = entry["body"].as_str().unwrap_or_default();
                let body = if entry["body_encoded"].as_bool() == Some(true) {
                    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(body).ok()?).ok()?
                } else {
                    body.to_string()
                };
                let headers = entry["headers"]
                    .as_object()
                    .map(|h| {
                        h.iter()
                            .map(|(k, v)| {
                                (k.to_ascii_lowercase(), v.as_str().unwrap_or_default().to_string())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Some((headers, body))
            })
            .collect()
    }

    /// The IAM actions (`ec2:DescribeInstances`, `elasticloadbalancing:CreateLoadBalancer`,
    /// `ecr:GetAuthorizationToken`, …) of the requests moto received from this project's
    /// programs, each with the program's application name from its user agent
    /// (`app/rust-cloud-provider`, `app/rust-cloud-provider-ecr`). Requests of the tests' own
    /// SDK clients and of the upstream Go CCM carry no such name and are left out.
    pub fn iam_calls(&self) -> Vec<(String, String)> {
        self.recorded()
            .into_iter()
            .filter_map(|(headers, body)| {
                let agent = [headers.get("x-amz-user-agent"), headers.get("user-agent")]
                    .into_iter()
                    .flatten()
                    .flat_map(|ua| ua.split(' '))
                    .find_map(|token| token.strip_prefix("app/"))?
                    .to_string();
                if !agent.starts_with("rust-cloud-provider") {
                    return None;
                }
                // Credential=<key>/<date>/<region>/<service>/aws4_request
                let service = headers
                    .get("authorization")?
                    .split("Credential=")
                    .nth(1)?
                    .split('/')
                    .nth(3)?
                    .to_string();
                let action = match headers.get("x-amz-target") {
                    Some(target) => target.rsplit('.').next()?.to_string(),
                    None => body
                        .split('&')
                        .find_map(|kv| kv.strip_prefix("Action="))?
                        .to_string(),
                };
                Some((agent, format!("{service}:{action}")))
            })
            .collect()
    }

    /// The bodies of every request moto received so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.recorded().into_iter().map(|(_, body)| body).collect()
    }

    /// The API actions (`Action=…` of the query protocol: `CreateTargetGroup`, `DescribeTags`, …)
    /// of every request moto received so far, in order.
    pub fn actions(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter_map(|body| {
                body.split('&')
                    .find_map(|kv| kv.strip_prefix("Action="))
                    .map(str::to_string)
            })
            .collect()
    }

    /// The mutating requests moto received since `from` (an index into [`Moto::requests`]),
    /// each as its action and its decoded parameters (anything but `Describe*`, `Get*`,
    /// `List*`).
    pub fn mutations_since(&self, from: usize) -> Vec<(String, BTreeMap<String, String>)> {
        self.requests()
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|body| {
                url::form_urlencoded::parse(body.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect::<BTreeMap<String, String>>()
            })
            .filter_map(|params| Some((params.get("Action")?.clone(), params)))
            .filter(|(a, _)| !(a.starts_with("Describe") || a.starts_with("Get") || a.starts_with("List")))
            .collect()
    }

    /// Runs `cloud-controller-manager-aws <args>` (a command such as `orphans` or `doctor`)
    /// against this moto, to its end: `(exit code, stdout, stderr)`.
    pub fn run_aws_command(&self, args: &[String]) -> Result<(i32, String, String)> {
        let out = std::process::Command::new(paths::workspace_binary("cloud-controller-manager-aws")?)
            .args(args)
            .envs(self.sdk_env())
            .env("RUST_LOG", "warn")
            .output()?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        ))
    }

    /// Creates a Classic ELB `name` (TCP 80 → 30080) in `subnet` with `tags`, as another
    /// controller or a stopped CCM left it.
    pub async fn create_classic_elb(&self, name: &str, subnet: &str, tags: &[(&str, &str)]) -> Result<()> {
        let mut request = self
            .elb()
            .create_load_balancer()
            .load_balancer_name(name)
            .listeners(
                aws_sdk_elasticloadbalancing::types::Listener::builder()
                    .protocol("TCP")
                    .load_balancer_port(80)
                    .instance_port(30080)
                    .build()?,
            )
            .subnets(subnet);
        for (k, v) in tags {
            request = request.tags(
                aws_sdk_elasticloadbalancing::types::Tag::builder()
                    .key(*k)
                    .value(*v)
                    .build()?,
            );
        }
        request.send().await.context("CreateLoadBalancer")?;
        Ok(())
    }

    /// Number of HTTP requests moto has answered so far (from its request log).
    pub fn request_count(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("\" 200 ") || l.contains("HTTP/1.1\" "))
            .count()
    }

    /// Stops moto now (its endpoint then refuses connections).
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Environment for a process using this moto through the SDK's default credential chain
    /// (static test credentials; no IMDS probing).
    pub fn sdk_env(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "AKIDTEST"),
            ("AWS_SECRET_ACCESS_KEY", crate::secrets::AWS_SECRET_ACCESS_KEY),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        ]
    }

    /// Requests an ACM certificate in this moto (with boto3 from moto's venv) and returns its
    /// ARN, for TLS listeners (moto checks that certificates exist).
    pub fn acm_certificate(&self, domain: &str) -> Result<String> {
        let python = paths::test_bin("moto_server")?
            .canonicalize()?
            .parent()
            .map(|d| d.join("python"))
            .context("moto's venv")?;
        let script = format!(
            "import boto3; c = boto3.client('acm', endpoint_url='{}', region_name='{REGION}', aws_access_key_id='AKIDTEST', aws_secret_access_key='x'); print(c.request_certificate(DomainName='{domain}')['CertificateArn'])",
            self.endpoint
        );
        let out = std::process::Command::new(python)
            .arg("-c")
            .arg(script)
            .output()?;
        if !out.status.success() {
            bail!(
                "requesting an ACM certificate from moto failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    /// Wipes all emulated state.
    pub async fn reset(&self) -> Result<()> {
        reqwest::Client::new()
            .post(format!("{}/moto-api/reset", self.endpoint))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The shared SDK configuration for clients of this moto: its endpoint, [`REGION`] and
    /// static test credentials.
    pub fn sdk_config(&self) -> aws_config::SdkConfig {
        aws_config::SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(
                Credentials::new("AKIDTEST", "moto-test-secret", None, None, "static"),
            ))
            .endpoint_url(&self.endpoint)
            .build()
    }

    /// An EC2 client of the real AWS SDK pointed at this moto.
    pub fn ec2(&self) -> Ec2 {
        Ec2::new(&self.sdk_config())
    }

    /// A Classic ELB client of the real AWS SDK pointed at this moto.
    pub fn elb(&self) -> aws_sdk_elasticloadbalancing::Client {
        aws_sdk_elasticloadbalancing::Client::new(&self.sdk_config())
    }

    /// An ELBv2 (NLB) client of the real AWS SDK pointed at this moto.
    pub fn elbv2(&self) -> aws_sdk_elasticloadbalancingv2::Client {
        aws_sdk_elasticloadbalancingv2::Client::new(&self.sdk_config())
    }

    /// A `[Global]` + `[ServiceOverride]` cloud-config pointing the AWS provider at this moto for
    /// `world`, without any IMDS use.
    pub fn cloud_config(&self, world: &World) -> String {
        let mut s = format!(
            "[Global]\nRegion = {REGION}\nVPC = {}\nSubnetID = {}\nKubernetesClusterID = {}\n",
            world.vpc_id, world.subnets[0].1, world.cluster_id
        );
        for (id, service, signing) in [
            ("ec2", "EC2", "ec2"),
            ("elb", "Elastic Load Balancing", "elasticloadbalancing"),
            ("elbv2", "Elastic Load Balancing v2", "elasticloadbalancing"),
        ] {
            s.push_str(&format!(
                "\n[ServiceOverride \"{id}\"]\nService = {service}\nRegion = {REGION}\nURL = {}\n\
                 SigningRegion = {REGION}\nSigningName = {signing}\n",
                self.endpoint
            ));
        }
        s
    }

    /// Builds a cluster-shaped world: a VPC, one subnet per zone of [`ZONES`], an internet
    /// gateway, a route table and a security group (all tagged
    /// `kubernetes.io/cluster/<cluster_id>=owned`), and `instances` running instances spread
    /// over the two zones, tagged for the cluster.
    pub async fn build_world(&self, cluster_id: &str, instances: usize) -> Result<World> {
        let ec2 = self.ec2();
        let tag_key = format!("kubernetes.io/cluster/{cluster_id}");
        let tags = |rt: ResourceType, name: &str| {
            TagSpecification::builder()
                .resource_type(rt)
                .tags(Tag::builder().key(&tag_key).value("owned").build())
                .tags(Tag::builder().key("Name").value(name).build())
                .build()
        };
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .tag_specifications(tags(ResourceType::Vpc, cluster_id))
            .send()
            .await
            .context("CreateVpc")?;
        let vpc_id = vpc
            .vpc()
            .and_then(|v| v.vpc_id())
            .context("CreateVpc: no id")?
            .to_string();

        let mut subnets = Vec::new();
        for (i, zone) in ZONES.iter().enumerate() {
            let subnet = ec2
                .create_subnet()
                .vpc_id(&vpc_id)
                .availability_zone(*zone)
                .cidr_block(format!("10.0.{}.0/20", 16 * i))
                .tag_specifications(tags(ResourceType::Subnet, &format!("{cluster_id}-{zone}")))
                .send()
                .await
                .context("CreateSubnet")?;
            let id = subnet
                .subnet()
                .and_then(|s| s.subnet_id())
                .context("CreateSubnet: no id")?;
            subnets.push((zone.to_string(), id.to_string()));
        }

        let igw = ec2
            .create_internet_gateway()
            .tag_specifications(tags(ResourceType::InternetGateway, cluster_id))
            .send()
            .await
            .context("CreateInternetGateway")?;
        let igw_id = igw
            .internet_gateway()
            .and_then(|g| g.internet_gateway_id())
            .context("CreateInternetGateway: no id")?
            .to_string();
        ec2.attach_internet_gateway()
            .internet_gateway_id(&igw_id)
            .vpc_id(&vpc_id)
            .send()
            .await
            .context("AttachInternetGateway")?;

        let rt = ec2
            .create_route_table()
            .vpc_id(&vpc_id)
            .tag_specifications(tags(ResourceType::RouteTable, cluster_id))
            .send()
            .await
            .context("CreateRouteTable")?;
        let route_table_id = rt
            .route_table()
            .and_then(|r| r.route_table_id())
            .context("CreateRouteTable: no id")?
            .to_string();
        ec2.create_route()
            .route_table_id(&route_table_id)
            .destination_cidr_block("0.0.0.0/0")
            .gateway_id(&igw_id)
            .send()
            .await
            .context("CreateRoute 0.0.0.0/0")?;
        for (_, subnet) in &subnets {
            ec2.associate_route_table()
                .route_table_id(&route_table_id)
                .subnet_id(subnet)
                .send()
                .await
                .context("AssociateRouteTable")?;
        }

        let sg = ec2
            .create_security_group()
            .group_name(format!("{cluster_id}-nodes"))
            .description("nodes of the test cluster")
            .vpc_id(&vpc_id)
            .tag_specifications(tags(ResourceType::SecurityGroup, &format!("{cluster_id}-nodes")))
            .send()
            .await
            .context("CreateSecurityGroup")?;
        let security_group_id = sg.group_id().context("CreateSecurityGroup: no id")?.to_string();

        let mut world = World {
            cluster_id: cluster_id.to_string(),
            vpc_id,
            subnets,
            internet_gateway_id: igw_id,
            route_table_id,
            security_group_id,
            instances: Vec::new(),
        };
        world.instances = self.run_instances(&world, instances).await?;
        Ok(world)
    }

    /// Runs `count` more instances in `world`, alternating between its zones.
    pub async fn run_instances(&self, world: &World, count: usize) -> Result<Vec<Instance>> {
        let ec2 = self.ec2();
        let tag_key = format!("kubernetes.io/cluster/{}", world.cluster_id);
        let mut ids = Vec::new();
        // RunInstances per zone (at most 100 at a time) for the zone's share.
        let mut batches = Vec::new();
        for (zi, (zone, subnet)) in world.subnets.iter().enumerate() {
            let mut n = count / world.subnets.len() + usize::from(zi < count % world.subnets.len());
            while n > 0 {
                batches.push((zone, subnet, n.min(100)));
                n -= n.min(100);
            }
        }
        for (zone, subnet, n) in batches {
            let out = ec2
                .run_instances()
                .image_id("ami-12c6146b")
                .instance_type(InstanceType::T3Medium)
                .min_count(n as i32)
                .max_count(n as i32)
                .subnet_id(subnet)
                .security_group_ids(&world.security_group_id)
                .tag_specifications(
                    TagSpecification::builder()
                        .resource_type(ResourceType::Instance)
                        .tags(Tag::builder().key(&tag_key).value("owned").build())
                        .build(),
                )
                .send()
                .await
                .with_context(|| format!("RunInstances in {zone}"))?;
            ids.extend(
                out.instances()
                    .iter()
                    .filter_map(|i| i.instance_id().map(str::to_string)),
            );
        }
        self.describe(&ids).await
    }

    /// Describes instances by ID (following `NextToken`).
    pub async fn describe(&self, ids: &[String]) -> Result<Vec<Instance>> {
        let mut result = Vec::new();
        for chunk in ids.chunks(500) {
            let mut pages = self
                .ec2()
                .describe_instances()
                .set_instance_ids(Some(chunk.to_vec()))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.context("DescribeInstances")?;
                for r in page.reservations() {
                    for i in r.instances() {
                        result.push(Instance {
                            id: i.instance_id().unwrap_or_default().to_string(),
                            zone: i
                                .placement()
                                .and_then(|p| p.availability_zone())
                                .unwrap_or_default()
                                .to_string(),
                            private_dns_name: i.private_dns_name().unwrap_or_default().to_string(),
                            private_ip: i.private_ip_address().unwrap_or_default().to_string(),
                            public_ip: i.public_ip_address().map(str::to_string),
                            public_dns_name: i
                                .public_dns_name()
                                .filter(|s| !s.is_empty())
                                .map(str::to_string),
                            instance_type: i
                                .instance_type()
                                .map(|t| t.as_str().to_string())
                                .unwrap_or_default(),
                            state: i
                                .state()
                                .and_then(|s| s.name())
                                .map(|n| n.as_str().to_string())
                                .unwrap_or_default(),
                        });
                    }
                }
            }
        }
        result.sort_by_key(|i| ids.iter().position(|id| *id == i.id));
        Ok(result)
    }

    /// Lists the instances carrying the cluster tag of `cluster_id`.
    pub async fn cluster_instances(&self, cluster_id: &str) -> Result<Vec<Instance>> {
        let out = self
            .ec2()
            .describe_instances()
            .filters(
                Filter::builder()
                    .name(format!("tag:kubernetes.io/cluster/{cluster_id}"))
                    .values("owned")
                    .build(),
            )
            .send()
            .await?;
        let ids: Vec<String> = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect();
        self.describe(&ids).await
    }
}

/// A cluster-shaped VPC in moto.
#[derive(Debug, Clone)]
pub struct World {
    /// The cluster ID (tag key `kubernetes.io/cluster/<id>`).
    pub cluster_id: String,
    /// The VPC.
    pub vpc_id: String,
    /// `(availability zone, subnet id)` pairs, one per zone of [`ZONES`].
    pub subnets: Vec<(String, String)>,
    /// The internet gateway attached to the VPC.
    pub internet_gateway_id: String,
    /// The cluster-tagged route table (default route via the internet gateway).
    pub route_table_id: String,
    /// The cluster-tagged node security group.
    pub security_group_id: String,
    /// The instances started with the world.
    pub instances: Vec<Instance>,
}

impl World {
    /// The private DNS names of the world's instances: the Node names kubelet would register.
    pub fn node_names(&self) -> Vec<&str> {
        self.instances
            .iter()
            .map(|i| i.private_dns_name.as_str())
            .collect()
    }
}

/// The mutating API actions among `actions` (anything but `Describe*`, `Get*`, `List*`).
pub fn mutating(actions: &[String]) -> Vec<String> {
    actions
        .iter()
        .filter(|a| !(a.starts_with("Describe") || a.starts_with("Get") || a.starts_with("List")))
        .cloned()
        .collect()
}

/// What the tests need to know about one EC2 instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `i-…`
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// `ip-10-0-1-4.ec2.internal`
    pub private_dns_name: String,
    /// Primary private IPv4 address.
    pub private_ip: String,
    /// Public IPv4 address, if any.
    pub public_ip: Option<String>,
    /// Public DNS name, if any.
    pub public_dns_name: Option<String>,
    /// e.g. `t3.medium`.
    pub instance_type: String,
    /// e.g. `running`.
    pub state: String,
}

impl Instance {
    /// `aws:///<zone>/<id>`: the provider ID the cloud-node controller gives its Node.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }

    /// This instance's Node as after the cloud-node controller: named by the private DNS name,
    /// with the provider ID, no taint.
    pub fn node(&self) -> k8s_openapi::api::core::v1::Node {
        crate::k8s::node_with_provider_id(&self.private_dns_name, &self.provider_id())
    }
}
