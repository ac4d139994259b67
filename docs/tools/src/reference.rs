//! The API reference in Markdown, one page per proto package, generated from the descriptor set
//! the services serve for reflection (comments included): every service with its RPCs and their
//! HTTP routes, every message with its fields, every enum with its values. The pages are
//! checked in under `docs/src/api/reference`; a test fails when they differ from the proto.

use std::collections::BTreeMap;
use std::fmt::Write;

use prost_reflect::{DescriptorPool, EnumDescriptor, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor, MethodDescriptor};

/// The packages documented, and the page each one gets.
pub const PACKAGES: &[(&str, &str)] = &[
    ("socialgraph.relation.v1", "relation"),
    ("socialgraph.projection.v1", "projection"),
    ("socialgraph.counter.v1", "counter"),
    ("socialgraph.feed.v1", "feed"),
    ("socialgraph.message.v1", "message"),
    ("socialgraph.events.v1", "events"),
];

/// The first line of every generated page.
pub const GENERATED: &str = "<!-- Generated from the proto by `make reference` (docs/tools): do not edit. -->";

/// Every page: (page name without `.md`, Markdown).
///
/// # Errors
/// The embedded descriptor sets do not decode, or a route cannot be read (build defects).
pub fn pages() -> anyhow::Result<Vec<(String, String)>> {
    let pool = socialgraph_httpapi::pool()?;
    let mut http = BTreeMap::new();
    for route in socialgraph_httpapi::routes(&pool)? {
        let body = matches!(route.body, socialgraph_httpapi::BodyMapping::Body).then_some(" (JSON body)").unwrap_or_default();
        http.insert(route.rpc.full_name().to_owned(), format!("`{} {}`{body}", route.method, route.template.text));
    }
    Ok(PACKAGES.iter().map(|(package, page)| ((*page).to_owned(), render(&pool, package, &http))).collect())
}

/// The page of one package.
fn render(pool: &DescriptorPool, package: &str, http: &BTreeMap<String, String>) -> String {
    let files: Vec<FileDescriptor> = pool.files().filter(|f| f.package_name() == package).collect();
    let mut out = format!("{GENERATED}\n\n# {package}\n\n");
    for file in &files {
        let _ = writeln!(out, "Source: `proto/{}`\n", file.name());
        push_comment(&mut out, comment(file, &[2]));
    }
    let services: Vec<_> = files.iter().flat_map(|f| f.services()).collect();
    if !services.is_empty() {
        out.push_str("## Services\n\n");
    }
    for service in &services {
        let _ = writeln!(out, "### {}\n", service.name());
        push_comment(&mut out, comment(&service.parent_file(), service.path()));
        out.push_str("| RPC | request → response | HTTP |\n|---|---|---|\n");
        for m in service.methods() {
            let route = http.get(m.full_name()).map_or("—", String::as_str);
            let _ = writeln!(out, "| [{}](#{}) | {} | {route} |", m.name(), m.name().to_lowercase(), signature(&m, package));
        }
        out.push('\n');
        for m in service.methods() {
            let _ = writeln!(out, "#### {}\n", m.name());
            let _ = writeln!(out, "{}\n", signature(&m, package));
            push_comment(&mut out, comment(&m.parent_file(), m.path()));
        }
    }
    let messages: Vec<MessageDescriptor> = files.iter().flat_map(|f| f.messages()).flat_map(with_nested).collect();
    if !messages.is_empty() {
        out.push_str("## Messages\n\n");
    }
    for m in &messages {
        push_message(&mut out, m, package);
    }
    let enums: Vec<EnumDescriptor> = files.iter().flat_map(|f| f.enums()).chain(messages.iter().flat_map(|m| m.child_enums())).collect();
    if !enums.is_empty() {
        out.push_str("## Enums\n\n");
    }
    for e in &enums {
        push_enum(&mut out, e);
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// `m` and its nested messages (map entries left out: they show as `map<K, V>` fields).
fn with_nested(m: MessageDescriptor) -> Vec<MessageDescriptor> {
    let mut out = vec![m.clone()];
    out.extend(m.child_messages().filter(|c| !c.is_map_entry()).flat_map(with_nested));
    out
}

/// ``[`In`](#in) → [`Out`](#out)``, with `stream` where a side streams.
fn signature(m: &MethodDescriptor, package: &str) -> String {
    let side = |streams: bool, d: MessageDescriptor| format!("{}{}", if streams { "stream " } else { "" }, type_link(d.full_name(), package));
    format!("{} → {}", side(m.is_client_streaming(), m.input()), side(m.is_server_streaming(), m.output()))
}

fn push_message(out: &mut String, m: &MessageDescriptor, package: &str) {
    let _ = writeln!(out, "### {}\n", display_name(m.full_name(), package));
    push_comment(out, comment(&m.parent_file(), m.path()));
    let fields: Vec<FieldDescriptor> = m.fields().collect();
    if fields.is_empty() {
        out.push_str("No fields.\n\n");
        return;
    }
    out.push_str("| field | number | type | description |\n|---|---|---|---|\n");
    for f in fields {
        let mut description = cell(&comment(&f.parent_file(), f.path()).unwrap_or_default());
        if let Some(oneof) = f.containing_oneof().filter(|o| !o.is_synthetic()) {
            description = format!("One of `{}`. {description}", oneof.name());
        }
        let _ = writeln!(out, "| `{}` | {} | {} | {} |", f.name(), f.number(), field_type(&f, package), description.trim());
    }
    out.push('\n');
}

fn push_enum(out: &mut String, e: &EnumDescriptor) {
    let _ = writeln!(out, "### {}\n", display_name(e.full_name(), e.package_name()));
    push_comment(out, comment(&e.parent_file(), e.path()));
    out.push_str("| value | number | description |\n|---|---|---|\n");
    for v in e.values() {
        let _ = writeln!(out, "| `{}` | {} | {} |", v.name(), v.number(), cell(&comment(&e.parent_file(), v.path()).unwrap_or_default()));
    }
    out.push('\n');
}

/// A field's type: scalar name, or a link to its message or enum, with `repeated`, `optional`
/// or `map<K, V>`.
fn field_type(f: &FieldDescriptor, package: &str) -> String {
    if f.is_map()
        && let Kind::Message(entry) = f.kind()
    {
        let (k, v) = (entry.map_entry_key_field(), entry.map_entry_value_field());
        return format!("map<{}, {}>", kind_name(&k.kind(), package), kind_name(&v.kind(), package));
    }
    let name = kind_name(&f.kind(), package);
    if f.is_list() {
        format!("repeated {name}")
    } else if f.containing_oneof().is_some_and(|o| o.is_synthetic()) {
        format!("optional {name}")
    } else {
        name
    }
}

fn kind_name(kind: &Kind, package: &str) -> String {
    match kind {
        Kind::Message(m) => type_link(m.full_name(), package),
        Kind::Enum(e) => type_link(e.full_name(), package),
        scalar => format!("`{}`", format!("{scalar:?}").to_lowercase()),
    }
}

/// A link to a socialgraph type's section (on this page or another package's), or the type's
/// full name for other packages' (google.protobuf) types.
fn type_link(full_name: &str, package: &str) -> String {
    let Some((page, owner)) =
        PACKAGES.iter().find(|(p, _)| full_name.strip_prefix(*p).is_some_and(|rest| rest.starts_with('.'))).map(|(p, page)| (*page, *p))
    else {
        return format!("`{full_name}`");
    };
    let name = display_name(full_name, owner);
    let anchor = name.to_lowercase().replace('.', "");
    if owner == package { format!("[`{name}`](#{anchor})") } else { format!("[`{name}`]({page}.md#{anchor})") }
}

/// The name within its package (`Outer.Inner` for nested types).
fn display_name<'a>(full_name: &'a str, package: &str) -> &'a str {
    full_name.strip_prefix(package).and_then(|n| n.strip_prefix('.')).unwrap_or(full_name)
}

/// The leading comment of the element at `path` of `file`, lines trimmed.
fn comment(file: &FileDescriptor, path: &[i32]) -> Option<String> {
    let info = file.file_descriptor_proto().source_code_info.as_ref()?;
    let location = info.location.iter().find(|l| l.path == path)?;
    let text = location.leading_comments.as_deref()?.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

fn push_comment(out: &mut String, text: Option<String>) {
    if let Some(text) = text {
        out.push_str(&escape_html(&text));
        out.push_str("\n\n");
    }
}

/// A comment as one table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    escape_html(&text.lines().collect::<Vec<_>>().join(" ")).replace('|', "\\|")
}

/// `<` outside code spans as `&lt;`, so that `Bearer <token>` is text, not an HTML tag.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn less_than_signs_outside_code_spans_are_escaped() {
        assert_eq!(escape_html("Bearer <token> and `a <b>`"), "Bearer &lt;token> and `a <b>`");
        assert_eq!(cell("one | two\nthree"), "one \\| two three");
    }
}
