//! The rule of the event flow (docs/src/architecture/events.md#events-carry-state): what a
//! consumer writes is a function of the records it read and its own store, never of a call to
//! another service. This reads the service crates' source as syntax and fails if any consumer
//! (a type implementing `BatchHandler`) can reach a gRPC client: a field of a client or channel
//! type, directly or through the structs its fields hold, or a client named inside its
//! `BatchHandler` impl.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quote::ToTokens;

/// What a consumer must not hold or name: generated gRPC clients and transport channels.
fn is_client(ident: &str) -> bool {
    ident.ends_with("ServiceClient") || ident.ends_with("_service_client") || ident == "Channel"
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The identifiers of a piece of syntax, in order.
fn idents(tokens: proc_macro2::TokenStream) -> Vec<String> {
    let mut out = Vec::new();
    for t in tokens {
        match t {
            proc_macro2::TokenTree::Ident(i) => out.push(i.to_string()),
            proc_macro2::TokenTree::Group(g) => out.extend(idents(g.stream())),
            _ => {}
        }
    }
    out
}

/// A struct as the scan sees it: its file, and the identifiers of each field's type.
type Fields = (String, Vec<Vec<String>>);

#[derive(Default)]
struct Source {
    /// struct name → every struct of that name
    structs: BTreeMap<String, Vec<Fields>>,
    /// consumers: (type name, file, identifiers of the impl block)
    handlers: Vec<(String, String, Vec<String>)>,
}

impl Source {
    fn items(&mut self, file: &str, items: &[syn::Item]) {
        for item in items {
            match item {
                syn::Item::Struct(s) => {
                    let fields = s.fields.iter().map(|f| idents(f.ty.to_token_stream())).collect();
                    self.structs.entry(s.ident.to_string()).or_default().push((file.to_owned(), fields));
                }
                syn::Item::Impl(i) => {
                    let is_handler = i.trait_.as_ref().and_then(|(_, path, _)| path.segments.last()).is_some_and(|s| s.ident == "BatchHandler");
                    if let (true, syn::Type::Path(p)) = (is_handler, &*i.self_ty)
                        && let Some(last) = p.path.segments.last()
                    {
                        self.handlers.push((last.ident.to_string(), file.to_owned(), idents(i.to_token_stream())));
                    }
                }
                syn::Item::Mod(m) => {
                    if let Some((_, inner)) = &m.content {
                        self.items(file, inner);
                    }
                }
                _ => {}
            }
        }
    }

    /// The first chain of struct fields from `start` that ends in a client, if any. A name
    /// resolves to the structs of that name in the consumer's own crate and in the shared
    /// libraries (a service crate depends on no other service crate, so a struct of the same
    /// name in another service is not the one its fields hold).
    fn reaches_client(&self, start: &str, file: &str) -> Option<Vec<String>> {
        let krate = crate_of(file);
        let visible = |f: &str| f.starts_with("libs/") || crate_of(f) == krate;
        let mut seen = BTreeSet::new();
        let mut queue = vec![vec![start.to_owned()]];
        while let Some(chain) = queue.pop() {
            let name = chain.last().cloned().unwrap_or_default();
            if !seen.insert(name.clone()) {
                continue;
            }
            for (_, fields) in self.structs.get(&name).into_iter().flatten().filter(|(f, _)| visible(f)) {
                for ty in fields {
                    if let Some(client) = ty.iter().find(|i| is_client(i)) {
                        let mut found = chain.clone();
                        found.push(client.clone());
                        return Some(found);
                    }
                    for i in ty.iter().filter(|i| self.structs.contains_key(*i)) {
                        let mut next = chain.clone();
                        next.push(i.clone());
                        queue.push(next);
                    }
                }
            }
        }
        None
    }
}

/// The crate directory a scanned file belongs to: `services/counter`, `libs/cache`.
fn crate_of(file: &str) -> String {
    file.split('/').take(2).collect::<Vec<_>>().join("/")
}

fn scan(root: &Path) -> Source {
    let mut files = Vec::new();
    for dir in ["services", "libs"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut source = Source::default();
    for f in files.iter().filter(|f| f.components().any(|c| c.as_os_str() == "src")) {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", f.display()));
        let name = f.strip_prefix(root).unwrap_or(f).display().to_string();
        source.items(&name, &parsed.items);
    }
    source
}

#[test]
fn no_consumer_holds_or_names_a_client_of_another_service() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let source = scan(&root);
    let consumers: BTreeSet<&str> = source.handlers.iter().map(|(n, _, _)| n.as_str()).collect();
    // The scan sees the consumers of every service (a scan that found none would prove nothing).
    for expected in ["Projector", "Ingest", "MuteCopier", "EdgeCountCounter", "UnreadCounter", "AccountEnder"] {
        assert!(consumers.contains(expected), "the scan finds the consumer {expected} (found {consumers:?})");
    }
    let mut faults = Vec::new();
    for (name, file, body) in &source.handlers {
        if let Some(client) = body.iter().find(|i| is_client(i)) {
            faults.push(format!("{file}: impl BatchHandler for {name} names {client}"));
        }
        if let Some(chain) = source.reaches_client(name, file) {
            faults.push(format!("{file}: consumer {name} reaches a client through {}", chain.join(" → ")));
        }
    }
    assert!(faults.is_empty(), "consumers must apply what they read, never ask a peer service:\n{}", faults.join("\n"));
}

#[test]
fn the_check_finds_a_client_behind_a_field() {
    // The shape of the consumer this rule replaced: a handler holding a struct that holds a
    // projection-svc client.
    let text = r"
        struct Counters { store: Store, projection: ProjectionServiceClient<Channel> }
        struct RelationCounter { counters: std::sync::Arc<Counters> }
        impl BatchHandler for RelationCounter {}
    ";
    let file = "services/counter/src/consume.rs";
    let mut source = Source::default();
    source.items(file, &syn::parse_file(text).expect("parses").items);
    assert_eq!(
        source.reaches_client("RelationCounter", file),
        Some(vec!["RelationCounter".into(), "Counters".into(), "ProjectionServiceClient".into()])
    );
    // A struct of the same name in another service is not the one the consumer holds.
    let other = "struct Pool { channel: Channel } struct Forwarder { pool: Pool }";
    source.items("services/gateway/src/upstream.rs", &syn::parse_file(other).expect("parses").items);
    let ours = "struct Pooled { pool: Pool } impl BatchHandler for Pooled {}";
    source.items(file, &syn::parse_file(ours).expect("parses").items);
    assert_eq!(source.reaches_client("Pooled", file), None);
    let gateway = "services/gateway/src/forward.rs";
    assert!(source.reaches_client("Forwarder", gateway).is_some(), "within its own crate the name resolves");
}
