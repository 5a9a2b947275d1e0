//! YAML read as upstream's `yaml.Unmarshal` into string fields reads it: a plain scalar that
//! looks like a number or a boolean (`0123`, `1e3`, `01`, `true`) keeps its text exactly as
//! written. A generic YAML → JSON value would turn `password: 0123` into the number 123 (or
//! 83, read as octal) and silently log in with the wrong password.
//!
//! Two passes over the (small) file: the first gives the structure, the second reads every
//! non-string scalar again as [`serde_saphyr::Spanned`] and takes its source text.

use std::fmt;

use serde::{
    Deserialize,
    de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::Value;

/// Parses `text` into a JSON value whose scalars are all strings (as written) or null.
pub fn parse(text: &str) -> Result<Value, serde_saphyr::Error> {
    let shape: Value = serde_saphyr::from_str(text)?;
    serde_saphyr::with_deserializer_from_str(text, |de| Shape { shape: &shape, text }.deserialize(de))
}

/// Re-reads a value of known shape, replacing non-string scalars by their source text.
struct Shape<'a> {
    shape: &'a Value,
    text: &'a str,
}

fn source_text(text: &str, location: &serde_saphyr::Location) -> Option<String> {
    let span = location.span();
    let start = usize::try_from(span.byte_offset()?).ok()?;
    let len = usize::try_from(span.byte_len()?).ok()?;
    text.get(start..start + len).map(|s| s.trim().to_string())
}

impl<'de> DeserializeSeed<'de> for Shape<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.shape {
            Value::Object(map) => deserializer.deserialize_map(MapShape { map, text: self.text }),
            Value::Array(items) => deserializer.deserialize_seq(SeqShape {
                items,
                text: self.text,
            }),
            Value::Bool(_) | Value::Number(_) => {
                let spanned =
                    <serde_saphyr::Spanned<IgnoredAny> as serde::Deserialize>::deserialize(deserializer)?;
                Ok(source_text(self.text, &spanned.defined)
                    .map(Value::String)
                    .unwrap_or_else(|| self.shape.clone()))
            }
            other => {
                let _ = IgnoredAny::deserialize(deserializer)?;
                Ok(other.clone())
            }
        }
    }
}

struct MapShape<'a> {
    map: &'a serde_json::Map<String, Value>,
    text: &'a str,
}

impl<'de> Visitor<'de> for MapShape<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let shape = self.map.get(&key).unwrap_or(&Value::Null);
            let v = access.next_value_seed(Shape {
                shape,
                text: self.text,
            })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

struct SeqShape<'a> {
    items: &'a [Value],
    text: &'a str,
}

impl<'de> Visitor<'de> for SeqShape<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        let mut i = 0;
        loop {
            let shape = self.items.get(i).unwrap_or(&Value::Null);
            match access.next_element_seed(Shape {
                shape,
                text: self.text,
            })? {
                Some(v) => out.push(v),
                None => break,
            }
            i += 1;
        }
        Ok(Value::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_and_bool_looking_scalars_keep_their_text() {
        let v = parse(
            "global:\n  user: 0123\n  password: 1e3\n  port: 8443\n  insecureFlag: true\n  other: \"007\"\n  none:\nvcenter:\n  a:\n    datacenters: [01, DC1, 2.50]\n    password: 0x1F\n",
        )
        .unwrap();
        assert_eq!(v["global"]["user"], "0123");
        assert_eq!(v["global"]["password"], "1e3");
        assert_eq!(v["global"]["port"], "8443");
        assert_eq!(v["global"]["insecureFlag"], "true");
        assert_eq!(v["global"]["other"], "007");
        assert_eq!(v["global"]["none"], Value::Null);
        assert_eq!(
            v["vcenter"]["a"]["datacenters"],
            serde_json::json!(["01", "DC1", "2.50"])
        );
        assert_eq!(v["vcenter"]["a"]["password"], "0x1F");
    }
}
