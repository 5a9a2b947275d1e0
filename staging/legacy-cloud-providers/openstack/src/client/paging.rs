//! Lists read page after page, and decoding answers.

use reqwest::Method;
use serde_json::Value;

use super::*;

impl OpenStackClient {
    /// Every item of a list, page after page: GET `path`, decode `body[key]`, and follow the
    /// `next` link of `body[<key>_links]` (its query, on `path`'s endpoint: the link may name
    /// another host) until there is none. A page cut short by the server's page size is never
    /// taken for the whole list (that made the route controller take live next hops for
    /// blackholes past nova's page size).
    pub async fn list<T: serde::de::DeserializeOwned>(
        &self,
        service: Service,
        path: &str,
        key: &str,
    ) -> Result<Vec<T>, ClientError> {
        let base = path.split_once('?').map_or(path, |(p, _)| p);
        let mut out = Vec::new();
        let mut page_path = path.to_string();
        for _ in 0..MAX_PAGES {
            let page = self.get(service, &page_path).await?;
            let items: Vec<T> = decode(&page, key, &page_path)?;
            let empty = items.is_empty();
            out.extend(items);
            match next_page_query(&page, key) {
                Some(q) if !empty => {
                    let next = format!("{base}?{q}");
                    if next == page_path {
                        // Never a partial list on doubt: the caller's sync fails and is retried.
                        return Err(ClientError::Decode {
                            method: Method::GET,
                            url: page_path,
                            message: format!("the next page of {key} is this page again"),
                        });
                    }
                    page_path = next;
                }
                _ => return Ok(out),
            }
        }
        Err(ClientError::Decode {
            method: Method::GET,
            url: path.to_string(),
            message: format!("more than {MAX_PAGES} pages of {key}"),
        })
    }
}

/// The query of the `next` link of a list page (`<key>_links`, as nova, neutron and Octavia
/// give one when there are more), if any.
pub fn next_page_query(page: &Value, key: &str) -> Option<String> {
    page.get(format!("{key}_links"))?
        .as_array()?
        .iter()
        .find(|l| l.get("rel").and_then(Value::as_str) == Some("next"))?
        .get("href")?
        .as_str()?
        .split_once('?')
        .map(|(_, q)| q.to_string())
        .filter(|q| !q.is_empty())
}

/// Most pages [`OpenStackClient::list`] reads for one list (a bound against a server whose
/// `next` links never end).
pub const MAX_PAGES: usize = 10_000;

/// Decodes `value[key]`.
pub fn decode<T: serde::de::DeserializeOwned>(
    value: &Value,
    key: &str,
    path: &str,
) -> Result<T, ClientError> {
    serde_json::from_value(value.get(key).cloned().unwrap_or(Value::Null)).map_err(|e| ClientError::Decode {
        method: Method::GET,
        url: path.to_string(),
        message: format!("field {key:?}: {e}"),
    })
}

/// Percent-encodes a query value.
pub fn query_escape(v: &str) -> String {
    url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
}
