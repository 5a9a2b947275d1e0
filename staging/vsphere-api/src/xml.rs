//! Just enough XML for vim25 SOAP, on quick-xml: a tree of elements (local names, so any
//! namespace prefix works) and an escaping writer for request bodies.
//!
//! vim25 answers mark polymorphic values with the XML Schema instance `type` attribute, written
//! `xsi:type` or — by vcsim — `XMLSchema-instance:type` with the namespace declared on the
//! element. A prefixed attribute whose local name is `type` is read as that type
//! ([`Element::xsi_type`]); the unprefixed `type` attribute is a managed object reference's
//! type ([`Element::attr`]`("type")`).

use quick_xml::{Reader, events::Event};

/// One element: local name, unprefixed attributes, `xsi:type`, text and children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    /// Local name (prefix stripped).
    pub name: String,
    /// Unprefixed attributes.
    pub attrs: Vec<(String, String)>,
    /// The XML Schema instance type, if any (prefix stripped, e.g. `ArrayOfGuestNicInfo`).
    pub xsi_type: Option<String>,
    /// Concatenated text content.
    pub text: String,
    /// Child elements in order.
    pub children: Vec<Element>,
}

/// A document that is not well-formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed XML: {0}")]
pub struct XmlError(pub String);

fn local(name: &str) -> String {
    match name.rsplit_once(':') {
        Some((_, l)) => l.to_string(),
        None => name.to_string(),
    }
}

fn strip_prefix(value: &str) -> String {
    value
        .rsplit_once(':')
        .map(|(_, v)| v)
        .unwrap_or(value)
        .to_string()
}

fn start(e: &quick_xml::events::BytesStart<'_>) -> Result<Element, XmlError> {
    let mut el = Element {
        name: local(e.name().as_ref()),
        ..Default::default()
    };
    for a in e.attributes() {
        let a = a.map_err(|e| XmlError(e.to_string()))?;
        let key: &str = a.key.as_ref();
        let key = key.to_string();
        let value = a
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| XmlError(e.to_string()))?
            .into_owned();
        if key.starts_with("xmlns") {
            continue;
        }
        match key.split_once(':') {
            Some((_, "type")) => el.xsi_type = Some(strip_prefix(&value)),
            Some(_) => {}
            None => el.attrs.push((key, value)),
        }
    }
    Ok(el)
}

/// How deep elements may nest. vim25 answers nest about 15 levels; the limit keeps the
/// recursive walks over the tree ([`Element::find`], `Clone`, `Drop`) far from the stack's end
/// whatever a server sends (a million nested elements would otherwise crash the process).
pub const MAX_DEPTH: usize = 256;

/// Parses a document into its root element.
pub fn parse(text: &str) -> Result<Element, XmlError> {
    let mut reader = Reader::from_str(text);
    let mut stack: Vec<Element> = Vec::new();
    loop {
        match reader.read_event().map_err(|e| XmlError(e.to_string()))? {
            Event::Start(e) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(XmlError(format!("elements nested deeper than {MAX_DEPTH}")));
                }
                stack.push(start(&e)?)
            }
            Event::Empty(e) => {
                let el = start(&e)?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => return Ok(el),
                }
            }
            Event::Text(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t.xml10_content());
                }
            }
            Event::CData(c) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&c.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                if let Some(top) = stack.last_mut() {
                    let name: &str = &r;
                    let name = name.to_string();
                    let resolved = match name.as_str() {
                        "lt" => "<".to_string(),
                        "gt" => ">".to_string(),
                        "amp" => "&".to_string(),
                        "quot" => "\"".to_string(),
                        "apos" => "'".to_string(),
                        n if n.starts_with("#x") => u32::from_str_radix(&n[2..], 16)
                            .ok()
                            .and_then(char::from_u32)
                            .map(String::from)
                            .unwrap_or_default(),
                        n if n.starts_with('#') => n[1..]
                            .parse::<u32>()
                            .ok()
                            .and_then(char::from_u32)
                            .map(String::from)
                            .unwrap_or_default(),
                        _ => String::new(),
                    };
                    top.text.push_str(&resolved);
                }
            }
            Event::End(_) => {
                let done = stack.pop().ok_or_else(|| XmlError("unbalanced end tag".into()))?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(done),
                    None => return Ok(done),
                }
            }
            Event::Eof => return Err(XmlError("unexpected end of document".into())),
            _ => {}
        }
    }
}

impl Element {
    /// The first child named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child named `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The element at a path of child names.
    pub fn path(&self, names: &[&str]) -> Option<&Element> {
        names.iter().try_fold(self, |el, n| el.child(n))
    }

    /// The text of the child `name`, if present.
    pub fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }

    /// An unprefixed attribute.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first descendant (depth-first) named `name`.
    pub fn find(&self, name: &str) -> Option<&Element> {
        for c in &self.children {
            if c.name == name {
                return Some(c);
            }
            if let Some(f) = c.find(name) {
                return Some(f);
            }
        }
        None
    }
}

/// Escapes text for element content and attribute values.
pub fn escape(s: &str) -> String {
    quick_xml::escape::escape(s).into_owned()
}

/// Wraps a body in a SOAP 1.1 envelope.
pub fn envelope(body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
         xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_of_the_type_attribute_and_moref_types() {
        let doc = r#"<?xml version="1.0"?><e:Envelope xmlns:e="x"><e:Body><R xmlns="urn:vim25"><propSet><name>runtime.host</name><val xmlns:XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance" XMLSchema-instance:type="ManagedObjectReference" type="HostSystem">host-21</val></propSet><propSet><name>guest.net</name><val xsi:type="ArrayOfGuestNicInfo"><GuestNicInfo><ipAddress>10.0.0.1</ipAddress><ipAddress>fe80::1</ipAddress><deviceConfigId>4000</deviceConfigId></GuestNicInfo></val></propSet><empty/><t>a &amp; b &lt;c&gt;</t></R></e:Body></e:Envelope>"#;
        let root = parse(doc).unwrap();
        assert_eq!(root.name, "Envelope");
        let r = root.path(&["Body", "R"]).unwrap();
        let sets: Vec<&Element> = r.children_named("propSet").collect();
        let host = sets[0].child("val").unwrap();
        assert_eq!(
            (host.xsi_type.as_deref(), host.attr("type"), host.text.as_str()),
            (Some("ManagedObjectReference"), Some("HostSystem"), "host-21")
        );
        let net = sets[1].child("val").unwrap();
        assert_eq!(net.xsi_type.as_deref(), Some("ArrayOfGuestNicInfo"));
        let ips: Vec<&str> = net
            .child("GuestNicInfo")
            .unwrap()
            .children_named("ipAddress")
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(ips, vec!["10.0.0.1", "fe80::1"]);
        assert!(r.child("empty").is_some());
        assert_eq!(r.child_text("t"), Some("a & b <c>"));
        assert_eq!(root.find("deviceConfigId").unwrap().text, "4000");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let depth = 1_000_000;
        let doc = format!("{}{}", "<a>".repeat(depth), "</a>".repeat(depth));
        assert_eq!(
            parse(&doc),
            Err(XmlError(format!("elements nested deeper than {MAX_DEPTH}")))
        );
        let ok = format!("{}{}", "<a>".repeat(MAX_DEPTH), "</a>".repeat(MAX_DEPTH));
        let root = parse(&ok).expect("at the limit");
        assert!(root.find("b").is_none());
        drop(root.clone());
    }

    #[test]
    fn malformed_documents_are_errors() {
        assert!(parse("<a><b></a>").is_err());
        assert!(parse("<a>").is_err());
        assert_eq!(escape("<x & \"y\">"), "&lt;x &amp; &quot;y&quot;&gt;");
    }
}
