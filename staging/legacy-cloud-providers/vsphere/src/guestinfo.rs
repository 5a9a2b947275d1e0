//! VS-09: addresses statically configured through cloud-init's VMware guestinfo datasource come
//! first among the candidate node IPs, in the order the guestinfo lists them.
//!
//! The VM's `config.extraConfig` holds `guestinfo.metadata` (base64, as
//! `guestinfo.metadata.encoding = base64` says; any other encoding means "no metadata", as
//! upstream). The decoded metadata is YAML: either a `network:` mapping (cloud-init network
//! config v2, `ethernets.<name>.addresses`) or, with `network.encoding` `base64`/`b64` or
//! `gzip+base64`/`gz+b64`, a `network:` string holding that config encoded. Upstream walks the
//! `ethernets` of a Go map (random order); here they are taken in document order.

use std::{io::Read, net::IpAddr};

use base64::Engine as _;
use serde_json::Value;

/// The statically configured IPs, in guestinfo order; empty when there is no usable metadata.
/// A metadata that says it is base64 but does not decode is an error (as upstream).
pub fn static_addresses(extra_config: &[(String, String)]) -> Result<Vec<IpAddr>, String> {
    let get = |k: &str| {
        extra_config
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    let (metadata, encoding) = (get("guestinfo.metadata"), get("guestinfo.metadata.encoding"));
    if metadata.is_empty() || encoding != "base64" {
        return Ok(Vec::new());
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let decoded = b64
        .decode(metadata.trim())
        .map_err(|e| format!("guestinfo.metadata: not base64 ({e})"))?;
    let text = String::from_utf8(decoded).map_err(|_| "guestinfo.metadata: not UTF-8".to_string())?;
    let doc: Value = crate::yaml::parse(&text).map_err(|e| format!("guestinfo.metadata: not YAML ({e})"))?;
    let network_encoding = doc
        .get("network.encoding")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let network = match network_encoding {
        "base64" | "b64" | "gzip+base64" | "gz+b64" => {
            let encoded = doc.get("network").and_then(Value::as_str).unwrap_or_default();
            let mut bytes = b64
                .decode(encoded.trim())
                .map_err(|e| format!("guestinfo.metadata network: not base64 ({e})"))?;
            if network_encoding.starts_with("gz") {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(bytes.as_slice())
                    .read_to_end(&mut out)
                    .map_err(|e| format!("guestinfo.metadata network: not gzip ({e})"))?;
                bytes = out;
            }
            let text =
                String::from_utf8(bytes).map_err(|_| "guestinfo.metadata network: not UTF-8".to_string())?;
            crate::yaml::parse(&text).map_err(|e| format!("guestinfo.metadata network: not YAML ({e})"))?
        }
        _ => doc.get("network").cloned().unwrap_or(Value::Null),
    };
    let mut out: Vec<IpAddr> = Vec::new();
    if let Some(ethernets) = network.get("ethernets").and_then(Value::as_object) {
        for eth in ethernets.values() {
            for address in eth
                .get("addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let ip = address.split('/').next().unwrap_or_default();
                if let Ok(ip) = ip.parse::<IpAddr>()
                    && !out.contains(&ip)
                {
                    out.push(ip);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn extra(metadata: &str, encoding: &str) -> Vec<(String, String)> {
        vec![
            ("guestinfo.metadata".into(), metadata.into()),
            ("guestinfo.metadata.encoding".into(), encoding.into()),
        ]
    }

    fn b64(s: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    const NETWORK: &str = "version: 2\nethernets:\n  ens192:\n    addresses: [10.0.0.7/24, \"fd00::7/64\"]\n  ens224:\n    addresses:\n      - 192.168.1.9/24\n";

    #[test]
    fn raw_base64_and_gzip_network_configs() {
        let want: Vec<IpAddr> = ["10.0.0.7", "fd00::7", "192.168.1.9"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let raw = format!(
            "instance-id: vm-1\nnetwork:\n{}",
            NETWORK.lines().map(|l| format!("  {l}\n")).collect::<String>()
        );
        assert_eq!(
            static_addresses(&extra(&b64(raw.as_bytes()), "base64")).unwrap(),
            want
        );
        let encoded = format!("network.encoding: base64\nnetwork: {}\n", b64(NETWORK.as_bytes()));
        assert_eq!(
            static_addresses(&extra(&b64(encoded.as_bytes()), "base64")).unwrap(),
            want
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(NETWORK.as_bytes()).unwrap();
        let gzipped = format!(
            "network.encoding: gz+b64\nnetwork: {}\n",
            b64(&gz.finish().unwrap())
        );
        assert_eq!(
            static_addresses(&extra(&b64(gzipped.as_bytes()), "base64")).unwrap(),
            want
        );
    }

    #[test]
    fn no_or_foreign_metadata_is_no_preference_and_garbage_is_an_error() {
        assert!(static_addresses(&[]).unwrap().is_empty());
        assert!(
            static_addresses(&extra("e30=", "gzip+base64"))
                .unwrap()
                .is_empty()
        );
        assert!(
            static_addresses(&extra("!!!", "base64"))
                .unwrap_err()
                .contains("not base64")
        );
        let bad_net = "network.encoding: b64\nnetwork: \"***\"\n";
        assert!(
            static_addresses(&extra(&b64(bad_net.as_bytes()), "base64"))
                .unwrap_err()
                .contains("network: not base64")
        );
    }
}
