//! docs/src/configuration.md lists exactly the settings each service has: no setting of the
//! code is missing from the page, and no key on the page is unknown to the code.

use std::collections::BTreeSet;

use socialgraph_book::settings::{documented, env_name, serialized_keys, struct_fields};

fn page() -> String {
    std::fs::read_to_string(socialgraph_book::book_src().join("configuration.md")).unwrap_or_default()
}

/// `section.field` for every field of a section's struct.
fn section(name: &str, fields: Vec<&'static str>) -> BTreeSet<String> {
    fields.into_iter().map(|f| format!("{name}.{f}")).collect()
}

/// The keys of the service's section on the page (and of `## server`, which every service but the
/// gateway has), each row's variable checked against its key.
fn on_page(page: &str, service: &str, with_server: bool) -> BTreeSet<String> {
    let mut rows = documented(page, service);
    if with_server {
        let server = documented(page, "server");
        assert!(server.iter().all(|(k, _)| k.starts_with("server.")), "the server table holds [server] keys only");
        rows.extend(server);
    }
    for (key, env) in &rows {
        if let Some(env) = env {
            assert_eq!(env, &env_name(key), "{service}: the variable of {key}");
        }
    }
    let keys: BTreeSet<String> = rows.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys.len(), rows.len(), "{service}: a key listed twice");
    keys
}

fn assert_same(service: &str, code: &BTreeSet<String>, page: &BTreeSet<String>) {
    let missing: Vec<_> = code.difference(page).collect();
    let unknown: Vec<_> = page.difference(code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/src/configuration.md, ## {service}: settings of the code not listed: {missing:?}; listed but not settings of the code: {unknown:?}"
    );
}

#[test]
fn the_configuration_reference_lists_exactly_every_setting_of_every_service() -> anyhow::Result<()> {
    let page = page();
    assert!(!page.is_empty(), "docs/src/configuration.md is missing");
    // Secrets are never serialized: their keys come from the sections' Deserialize.
    let auth = || section("auth", struct_fields::<socialgraph_relation::config::AuthSettings>());
    assert!(auth().contains("auth.admin_token") && auth().contains("auth.page_token_secret"));

    let mut relation = serialized_keys(&socialgraph_relation::Config::default())?;
    relation.extend(auth());
    assert_same("relation-svc", &relation, &on_page(&page, "relation-svc", true));

    let mut projection = serialized_keys(&socialgraph_projection::Config::default())?;
    projection.extend(auth());
    projection.extend(section("relation", struct_fields::<socialgraph_projection::config::RelationSettings>()));
    assert_same("projection-svc", &projection, &on_page(&page, "projection-svc", true));

    let mut counter = serialized_keys(&socialgraph_counter::Config::default())?;
    counter.extend(auth());
    assert_same("counter-svc", &counter, &on_page(&page, "counter-svc", true));

    let mut message = serialized_keys(&socialgraph_message::Config::default())?;
    message.extend(auth());
    assert_same("message-svc", &message, &on_page(&page, "message-svc", true));

    let gateway = serialized_keys(&socialgraph_gateway::Config::default())?;
    assert_same("gateway", &gateway, &on_page(&page, "gateway", false));
    Ok(())
}

#[test]
fn a_setting_missing_from_the_page_or_unknown_to_the_code_is_found() {
    let page = "## server\n\n| key | environment |\n|---|---|\n| `server.grpc_addr` | `SG_SERVER__GRPC_ADDR` |\n\n## x-svc\n\n| key | environment |\n|---|---|\n| `a.b` | `SG_A__B` |\n\n| accepted, not used | why |\n|---|---|\n| `a.c` | not used |\n\n## y\n\n| key |\n|---|\n| `z.z` |\n";
    let keys = on_page(page, "x-svc", true);
    assert_eq!(keys, ["a.b", "a.c", "server.grpc_addr"].into_iter().map(String::from).collect());
    let code: BTreeSet<String> = ["a.b", "a.d", "server.grpc_addr"].into_iter().map(String::from).collect();
    let caught = std::panic::catch_unwind(|| assert_same("x-svc", &code, &keys));
    assert!(caught.is_err(), "a.d is not listed and a.c is not a setting");
    assert_eq!(
        serialized_keys(&serde_json::json!({"s": {"a": 1, "b": {"c": [1]}}, "t": "x"})).ok(),
        Some(["s.a", "s.b.c", "t"].into_iter().map(String::from).collect())
    );
}
