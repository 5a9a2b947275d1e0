#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rcp_fuzz_targets::openstack_config(data));
