//! The API reference checked in under docs/src/api/reference is what the proto gives.

use socialgraph_book::{REFERENCE_DIR, book_src, reference};

#[test]
fn the_checked_in_api_reference_matches_the_proto() -> anyhow::Result<()> {
    let dir = book_src().join(REFERENCE_DIR);
    let pages = reference::pages()?;
    assert_eq!(pages.len(), reference::PACKAGES.len());
    for (name, generated) in &pages {
        let path = dir.join(format!("{name}.md"));
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(&checked_in == generated, "{} differs from the reference generated from proto/: run `make reference` and commit it", path.display());
    }
    // No page of a package that is gone: every page there is generated, or the index.
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let stem = name.trim_end_matches(".md");
        assert!(name == "index.md" || pages.iter().any(|(n, _)| n == stem), "{name} in {} is not generated: remove it", dir.display());
    }
    Ok(())
}

#[test]
fn the_reference_documents_every_rpc_field_and_enum_value_with_its_comment() -> anyhow::Result<()> {
    let pages = reference::pages()?;
    let relation = &pages.iter().find(|(n, _)| n == "relation").ok_or_else(|| anyhow::anyhow!("no relation page"))?.1;
    assert!(relation.starts_with(reference::GENERATED));
    assert!(relation.contains("| [Follow](#follow) | [`FollowRequest`](#followrequest) → [`FollowResponse`](#followresponse) | `POST /v1/users/{follower_id}/following/{followee_id}` |"));
    assert!(relation.contains("| [ImportFollows](#importfollows) | stream [`ImportFollowsRequest`](#importfollowsrequest) → [`ImportFollowsResponse`](#importfollowsresponse) | — |"));
    assert!(relation.contains("| `follower_id` | 1 | `int64` | The user who follows. > 0. |"), "fields carry their comments");
    assert!(relation.contains("Makes follower_id follow followee_id. Idempotent"), "RPCs carry their comments");
    let counter = &pages.iter().find(|(n, _)| n == "counter").ok_or_else(|| anyhow::anyhow!("no counter page"))?.1;
    assert!(counter.contains("repeated [`Metric`](events.md#metric)"), "types of other packages link to their page");
    let events = &pages.iter().find(|(n, _)| n == "events").ok_or_else(|| anyhow::anyhow!("no events page"))?.1;
    assert!(events.contains("| `RELATION_EVENT_KIND_FOLLOWED` | 1 |"), "enum values are listed");
    Ok(())
}
