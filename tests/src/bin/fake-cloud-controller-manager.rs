//! A cloud-controller-manager with the fake provider (cloud-config: the fake's JSON), for the
//! application's end-to-end tests (leader election, health, metrics, flags). Not a product.

fn main() -> std::process::ExitCode {
    k8s_cloud_provider::app::main(k8s_cloud_provider::app::ProviderSpec::new(
        "fake",
        k8s_cloud_provider::fake::factory(),
    ))
}
