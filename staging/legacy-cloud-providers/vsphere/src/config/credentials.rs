//! vCenter credentials from a Secret's data or a mounted directory (the CPI's
//! `<server>.username`/`<server>.password` keys, and the plain `username`/`password`).

use super::*;

/// Credentials per vCenter server from a Secret's data or a secrets directory's files:
/// `<server>.username` / `<server>.password`, or `server_<id>` / `username_<id>` /
/// `password_<id>` (trailing newlines trimmed). The shared-session keys
/// `<server>.vc-session-manager-url` / `<server>.vc-session-manager-token` (VS-22) are accepted
/// and ignored with a warning: this provider logs in with the user and password, so a server
/// with only session-manager keys is an error. An unknown key or a user without a password is
/// an error naming the key (never a value).
pub fn credentials_from_secret(
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<BTreeMap<String, (String, Secret)>, ConfigError> {
    let text = |k: &str| {
        String::from_utf8_lossy(&data[k])
            .trim_end_matches(['\n', '\r'])
            .to_string()
    };
    let mut users: BTreeMap<String, String> = BTreeMap::new();
    let mut passwords: BTreeMap<String, Secret> = BTreeMap::new();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    for key in data.keys() {
        if let Some(server) = key.strip_suffix(".username") {
            users.insert(server.to_string(), text(key));
        } else if let Some(server) = key.strip_suffix(".password") {
            passwords.insert(server.to_string(), Secret::new(text(key)));
        } else if let Some(id) = key.strip_prefix("server_") {
            ids.insert(id.to_string(), text(key));
        } else if key.starts_with("username_") || key.starts_with("password_") {
        } else if let Some(server) = key
            .strip_suffix(".vc-session-manager-url")
            .or_else(|| key.strip_suffix(".vc-session-manager-token"))
        {
            tracing::warn!(
                server,
                key = %key,
                "vsphere credentials: the shared session manager is not supported; logging in with <server>.username/.password"
            );
        } else {
            return Err(ConfigError(format!(
                "credentials secret: unknown key {key:?} (expected <server>.username, <server>.password, server_<id>, username_<id>, password_<id>)"
            )));
        }
    }
    for (id, server) in ids {
        if let Some(u) = data.get(&format!("username_{id}")) {
            users.insert(server.clone(), String::from_utf8_lossy(u).trim_end().to_string());
        }
        if let Some(p) = data.get(&format!("password_{id}")) {
            passwords.insert(
                server.clone(),
                Secret::new(String::from_utf8_lossy(p).trim_end().to_string()),
            );
        }
    }
    let mut out = BTreeMap::new();
    for (server, user) in users {
        let password = passwords.remove(&server).ok_or_else(|| {
            ConfigError(format!(
                "credentials secret: {server}.username has no matching password"
            ))
        })?;
        out.insert(server, (user, password));
    }
    Ok(out)
}

/// Reads a secrets directory (files named like Secret keys).
pub fn credentials_from_directory(
    dir: &std::path::Path,
) -> Result<BTreeMap<String, (String, Secret)>, ConfigError> {
    let mut data = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError(format!("secrets directory {}: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_file()
            && let Some(name) = path.file_name().and_then(|n| n.to_str())
            && !name.starts_with('.')
        {
            let bytes = std::fs::read(&path)
                .map_err(|e| ConfigError(format!("secrets directory file {}: {e}", path.display())))?;
            data.insert(name.to_string(), bytes);
        }
    }
    credentials_from_secret(&data)
}
