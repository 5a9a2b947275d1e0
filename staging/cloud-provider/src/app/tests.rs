//! Unit tests of the command: flags, provider specs, controller sets.

use super::*;

#[test]
fn worker_threads_default_to_one_and_follow_the_environment() {
    assert_eq!(worker_threads(None), Ok(1));
    assert_eq!(worker_threads(Some("4")), Ok(4));
    assert_eq!(worker_threads(Some(" 2 ")), Ok(2));
    for bad in ["0", "", "two", "-1"] {
        let e = worker_threads(Some(bad)).unwrap_err();
        assert!(
            e.contains("TOKIO_WORKER_THREADS") && e.contains(&format!("{bad:?}")),
            "{e}"
        );
    }
}

fn no_cloud() -> crate::registry::Factory {
    Arc::new(|_| Box::pin(async { Err("no cloud in this test".into()) }))
}

/// A replacement of the service controller takes its place, names, default and start
/// order; the built-in is not started; unknown or repeated replacements are refused.
#[test]
fn a_provider_controller_replaces_a_built_in_one_in_its_place() {
    let mine = || {
        ProviderController::new("my-service", "my-service-controller", |_| {
            let start: ProviderControllerStart = Arc::new(|_| Err("not started in this test".into()));
            Ok(start)
        })
        .with_aliases(&["my-lb"])
    };
    let spec = ProviderSpec::new("test", no_cloud())
        .with_controller(greeter())
        .replace_controller("service", mine());
    spec.check().unwrap();
    let names = spec.controller_names();
    assert_eq!(
        names,
        controllers::CONTROLLER_NAMES
            .iter()
            .copied()
            .chain(["greeter"])
            .collect::<Vec<_>>()
    );
    let registry = controller_registry(&spec);
    let options = parse_from(&spec, ["ccm", "--controllers=*,-my-lb,greeter", "--greeting=hi"]).unwrap();
    let validated = options.validate(&registry).unwrap();
    assert!(
        !registry.is_enabled(controllers::service::NAME, &validated.controllers),
        "the replacement answers to its own alias too"
    );
    let options = parse_from(&spec, ["ccm"]).unwrap();
    let validated = options.validate(&registry).unwrap();
    assert!(
        registry.is_enabled(controllers::service::NAME, &validated.controllers),
        "on by default as the built-in"
    );
    let starters = Starters::configure(&spec, &validated, &registry).unwrap();
    assert_eq!(
        starters.client_name(controllers::service::NAME),
        "my-service-controller"
    );
    assert!(
        starters.provided.contains_key(controllers::service::NAME),
        "the provider's is started"
    );

    let e = ProviderSpec::new("test", no_cloud())
        .replace_controller("firewall", mine())
        .check()
        .unwrap_err();
    assert!(
        e.contains("\"firewall\" is no built-in controller to replace"),
        "{e}"
    );
    let e = ProviderSpec::new("test", no_cloud())
        .replace_controller("service", mine())
        .replace_controller("service-lb-controller", mine())
        .check()
        .unwrap_err();
    assert!(e.contains("replaced twice"), "{e}");
}

/// A renamed built-in answers to its new name, its aliases and its old names, is started as
/// the built-in (its client name) and listed under the new name; clashes, unknown built-ins,
/// second renames and renaming a replaced controller are refused.
#[test]
fn a_built_in_controller_runs_under_the_name_a_provider_gives_it() {
    let spec = ProviderSpec::new("test", no_cloud())
        .with_controller(greeter())
        .rename_controller("service", "mycloud-lb-controller", &["mycloud-lb"]);
    spec.check().unwrap();
    let names = spec.controller_names();
    assert_eq!(
        names,
        [
            controllers::node::NAME,
            controllers::nodelifecycle::NAME,
            "mycloud-lb-controller",
            controllers::route::NAME,
            "greeter"
        ]
    );
    let registry = controller_registry(&spec);
    for off in [
        "-mycloud-lb",
        "-mycloud-lb-controller",
        "-service",
        "-service-lb-controller",
    ] {
        let options = parse_from(&spec, ["ccm", &format!("--controllers=*,{off}")]).unwrap();
        let validated = options.validate(&registry).unwrap();
        assert!(
            !registry.is_enabled("mycloud-lb-controller", &validated.controllers),
            "{off} names it"
        );
    }
    let validated = parse_from(&spec, ["ccm"]).unwrap().validate(&registry).unwrap();
    assert!(registry.is_enabled("mycloud-lb-controller", &validated.controllers));
    let starters = Starters::configure(&spec, &validated, &registry).unwrap();
    assert_eq!(
        starters.builtin("mycloud-lb-controller"),
        controllers::service::NAME
    );
    assert_eq!(
        starters.client_name("mycloud-lb-controller"),
        controllers::service::CLIENT_NAME
    );
    assert_eq!(legacy_name("mycloud-lb-controller"), "mycloud-lb-controller");

    let refused = |spec: ProviderSpec| spec.check().unwrap_err();
    let e = refused(ProviderSpec::new("test", no_cloud()).rename_controller("firewall", "fw", &[]));
    assert!(
        e.contains("\"firewall\" is no built-in controller to rename"),
        "{e}"
    );
    let e = refused(
        ProviderSpec::new("test", no_cloud())
            .rename_controller("service", "a", &[])
            .rename_controller("service-lb-controller", "b", &[]),
    );
    assert!(e.contains("renamed twice"), "{e}");
    let e = refused(
        ProviderSpec::new("test", no_cloud())
            .with_controller(greeter())
            .rename_controller("route", "greeter", &[]),
    );
    assert!(e.contains("\"greeter\" names both"), "{e}");
    let e = refused(
        ProviderSpec::new("test", no_cloud())
            .rename_controller("service", "lb", &["hello"])
            .with_controller(greeter()),
    );
    assert!(e.contains("\"hello\" names both"), "{e}");
    let mine = ProviderController::new("mine", "mine", |_| {
        let start: ProviderControllerStart = Arc::new(|_| Err("not started in this test".into()));
        Ok(start)
    });
    let e = refused(
        ProviderSpec::new("test", no_cloud())
            .replace_controller("service", mine)
            .rename_controller("service", "lb", &[]),
    );
    assert!(e.contains("both replaced and renamed"), "{e}");
}

/// The provider's own flags, for the closure factory test.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Mycloud flags")]
struct MycloudFlags {
    /// The region to manage.
    #[arg(long = "mycloud-region")]
    region: String,
}

struct Mycloud;

#[crate::async_trait]
impl CloudProvider for Mycloud {
    fn provider_name(&self) -> &str {
        "mycloud"
    }
}

/// A closure factory sees the cloud config, the cluster name and the provider's own flags,
/// which `--help` lists and a missing one refuses by name.
#[tokio::test]
async fn a_closure_factory_gets_the_provider_flags_and_the_cluster_name() {
    let spec = ProviderSpec::new("mycloud", |ctx: FactoryContext| async move {
        let flags: MycloudFlags = ctx.flags()?;
        if flags.region != "eu-1" || ctx.cluster_name != "prod" || ctx.config.as_deref() != Some(&b"x"[..]) {
            return Err(format!("unexpected context: {ctx:?} {flags:?}"));
        }
        Ok(Mycloud)
    })
    .with_flags(<MycloudFlags as clap::Args>::augment_args);
    let help = command(&spec).render_long_help().to_string();
    assert!(help.contains("--mycloud-region"), "{help}");
    let options = parse_from(&spec, ["ccm", "--mycloud-region=eu-1", "--cluster-name=prod"]).unwrap();
    let ctx = FactoryContext::new(Some(b"x".to_vec()))
        .with_cluster_name(options.generic.cluster_name.clone())
        .with_matches(options.matches.clone());
    assert!((spec.factory)(ctx.clone()).await.is_ok());
    let e = parse_from(&spec, ["ccm"]).err().unwrap().to_string();
    assert!(e.contains("--mycloud-region"), "a required provider flag: {e}");
    let other = FactoryContext::new(Some(b"x".to_vec()))
        .with_cluster_name("prod")
        .with_matches(
            parse_from(&spec, ["ccm", "--mycloud-region=us-9"])
                .unwrap()
                .matches,
        );
    let e = (spec.factory)(other).await.err().unwrap().to_string();
    assert!(e.contains("us-9"), "the factory's error: {e}");
    assert!(
        ctx.client("x").is_err(),
        "no Kubernetes configuration in this test"
    );
}

/// A provider controller with one flag `--greeting`, which must not be empty.
fn greeter() -> ProviderController {
    ProviderController::new("greeter", "greeter-controller", |m| {
        let greeting = m.get_one::<String>("greeting").cloned().unwrap_or_default();
        if greeting.is_empty() {
            return Err("--greeting must not be empty".into());
        }
        let start: ProviderControllerStart = Arc::new(|_| Err("not started in this test".into()));
        Ok(start)
    })
    .with_aliases(&["hello"])
    .enabled_by_default(false)
    .with_flags(|c| c.arg(clap::Arg::new("greeting").long("greeting").default_value("")))
}

fn configured(args: &[&str]) -> Result<Starters, Vec<String>> {
    let spec = ProviderSpec::new("test", no_cloud()).with_controller(greeter());
    let registry = controller_registry(&spec);
    let options = parse_from(&spec, std::iter::once("ccm").chain(args.iter().copied()))
        .map_err(|e| vec![e.to_string()])?;
    let validated = options.validate(&registry)?;
    Starters::configure(&spec, &validated, &registry)
}

#[test]
fn a_flag_given_twice_takes_the_last_value_as_go_does() {
    let spec = ProviderSpec::new("test", no_cloud());
    let args = [
        "ccm",
        "--v=2",
        "--leader-elect=true",
        "--controllers=*",
        "--v=4",
        "--leader-elect=false",
        "--controllers=cloud-node,service",
    ];
    let options = parse_from(&spec, args).expect("a repeated flag is accepted");
    assert_eq!(options.logging.verbosity, 4);
    assert!(!options.leader_election.leader_elect);
    // A list flag adds to what it had, as pflag's string slices do.
    assert_eq!(options.generic.controllers, ["*", "cloud-node", "service"]);
}

#[test]
fn a_provider_controller_is_a_controller_of_the_command() {
    let spec = ProviderSpec::new("test", no_cloud()).with_controller(greeter());
    command(&spec).debug_assert();
    assert_eq!(spec.controller_names().last(), Some(&"greeter"));
    // Off by default: not configured (its flags not checked) unless named, by name or alias.
    assert!(configured(&[]).expect("valid").provided.is_empty());
    for named in ["--controllers=*,greeter", "--controllers=hello"] {
        let errors = configured(&[named])
            .err()
            .expect("its flag is checked once enabled");
        assert_eq!(errors, ["--greeting must not be empty"], "{named}");
        let ok = configured(&[named, "--greeting=hi"]).expect("valid");
        assert_eq!(ok.client_name("greeter"), "greeter-controller");
    }
    assert!(
        configured(&["--controllers=*,-greeter"])
            .expect("valid")
            .provided
            .is_empty()
    );
}

#[test]
fn a_controller_named_like_another_is_refused_before_anything_starts() {
    assert_eq!(
        ProviderSpec::new("test", no_cloud())
            .with_controller(greeter())
            .check(),
        Ok(())
    );
    let clash = |name: &'static str, aliases: &'static [&'static str]| {
        ProviderSpec::new("test", no_cloud())
            .with_controller(greeter())
            .with_controller(ProviderController {
                name,
                aliases,
                ..greeter()
            })
            .check()
            .unwrap_err()
    };
    assert_eq!(
        clash("service", &[]),
        "provider \"test\": \"service\" names both \"service-lb-controller\" and the provider's \"service\""
    );
    assert!(
        clash("my-routes", &["route"])
            .contains("\"route\" names both \"node-route-controller\" and the provider's \"my-routes\""),
        "{}",
        clash("my-routes", &["route"])
    );
    assert!(
        clash("greeter", &[]).contains("\"greeter\" names both \"greeter\" and the provider's \"greeter\"")
    );
    assert!(
        clash("other", &["hello"]).contains("\"hello\" names both \"greeter\" and the provider's \"other\"")
    );
}

#[tokio::test]
async fn a_controller_task_that_panics_is_counted_and_reported_as_fatal() {
    let metrics = Arc::new(Metrics::new());
    let failed: Arc<ControllerFailure> = Arc::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn(async { panic!("loop bug") });
    supervise_controller(
        "service-lb-controller",
        task,
        failed.clone(),
        metrics.clone(),
        stop,
    )
    .await
    .expect("the watcher itself does not panic");
    assert!(failed.token.is_cancelled());
    let why = failed.what.lock().clone().expect("a reason");
    assert!(
        why.contains("\"service-lb-controller\" panicked: loop bug"),
        "{why}"
    );
    assert_eq!(
        metrics
            .panics_total
            .with_label_values(&["service-lb-controller"])
            .get(),
        1
    );
}

#[tokio::test]
async fn a_controller_that_stops_at_shutdown_is_no_failure() {
    let metrics = Arc::new(Metrics::new());
    let failed: Arc<ControllerFailure> = Arc::default();
    let stop = CancellationToken::new();
    let s2 = stop.clone();
    let task = tokio::spawn(async move { s2.cancelled().await });
    let watcher = supervise_controller(
        "cloud-node-controller",
        task,
        failed.clone(),
        metrics,
        stop.clone(),
    );
    stop.cancel();
    watcher.await.expect("watcher");
    assert!(!failed.token.is_cancelled());
}

/// `--version` names the binary's version, then the framework's; without one, the framework's.
#[test]
fn version_names_the_binary_then_the_framework() {
    let spec = ProviderSpec::new("test", no_cloud()).with_version("9.8.7");
    assert_eq!(
        command(&spec).render_version(),
        format!("cloud-controller-manager-test 9.8.7 (k8s-cloud-provider {FRAMEWORK_VERSION})\n")
    );
    let spec = ProviderSpec::new("test", no_cloud());
    assert_eq!(
        command(&spec).render_version(),
        format!("cloud-controller-manager-test {FRAMEWORK_VERSION}\n")
    );
}
