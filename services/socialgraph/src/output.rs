//! Printing results: a table for people (comfy-table) or JSON for scripts (serde_json), both
//! on standard output. Times print as RFC 3339 UTC with milliseconds.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds, e.g.
/// `2020-01-01T00:00:00.123Z`; the plain number when out of chrono's range.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// An optional time for a table cell: RFC 3339 or empty.
pub fn time_cell(ms: Option<i64>) -> String {
    ms.map(rfc3339).unwrap_or_default()
}

/// A row that can be shown in a table.
pub trait TableRow {
    /// Column titles.
    fn header() -> Vec<&'static str>;
    /// This row's cells, one per column.
    fn cells(&self) -> Vec<String>;
}

/// A table of `rows` with their header, as text.
pub fn table<T: TableRow>(rows: &[T]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(T::header());
    for r in rows {
        t.add_row(r.cells());
    }
    t.to_string()
}

/// Prints `value` as pretty JSON.
pub fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => out!("{s}"),
        // Serializing plain structs of numbers and strings cannot fail.
        Err(e) => eprintln!("error: cannot encode the result as JSON: {e}"),
    }
}

/// Prints `rows` as a table (with `footer` lines below it when not empty), or, with `json`,
/// `json_value` as JSON.
pub fn print_rows<T: TableRow, J: Serialize>(rows: &[T], json: bool, json_value: &J, footer: &[String]) {
    if json {
        print_json(json_value);
        return;
    }
    out!("{}", table(rows));
    for line in footer.iter().filter(|l| !l.is_empty()) {
        out!("{line}");
    }
}

/// A list entry as printed.
#[derive(Debug, Clone, Serialize)]
pub struct FollowRow {
    /// The account.
    pub user_id: i64,
    /// Follow time, RFC 3339.
    pub followed_at: Option<String>,
}

impl TableRow for FollowRow {
    fn header() -> Vec<&'static str> {
        vec!["user_id", "followed_at"]
    }
    fn cells(&self) -> Vec<String> {
        vec![self.user_id.to_string(), self.followed_at.clone().unwrap_or_default()]
    }
}

/// A relationship as printed.
#[derive(Debug, Clone, Serialize)]
pub struct RelationshipRow {
    /// The other user.
    pub other_user_id: i64,
    /// The user follows the other.
    pub following: bool,
    /// The other follows the user.
    pub followed_by: bool,
    /// When the user followed the other.
    pub followed_at: Option<String>,
    /// When the other followed the user.
    pub followed_by_at: Option<String>,
    /// The user blocks the other.
    pub blocking: bool,
    /// The other blocks the user.
    pub blocked_by: bool,
    /// The user mutes the other.
    pub muting: bool,
    /// The user's follow request to the other is pending.
    pub requested: bool,
    /// The other's follow request to the user is pending.
    pub requested_by: bool,
}

impl TableRow for RelationshipRow {
    fn header() -> Vec<&'static str> {
        vec![
            "other_user_id",
            "following",
            "followed_by",
            "followed_at",
            "followed_by_at",
            "blocking",
            "blocked_by",
            "muting",
            "requested",
            "requested_by",
        ]
    }
    fn cells(&self) -> Vec<String> {
        vec![
            self.other_user_id.to_string(),
            self.following.to_string(),
            self.followed_by.to_string(),
            self.followed_at.clone().unwrap_or_default(),
            self.followed_by_at.clone().unwrap_or_default(),
            self.blocking.to_string(),
            self.blocked_by.to_string(),
            self.muting.to_string(),
            self.requested.to_string(),
            self.requested_by.to_string(),
        ]
    }
}

/// A blocked or muted account as printed.
#[derive(Debug, Clone, Serialize)]
pub struct RestrictedRow {
    /// The account.
    pub user_id: i64,
    /// When it was blocked or muted, RFC 3339.
    pub since: Option<String>,
}

impl TableRow for RestrictedRow {
    fn header() -> Vec<&'static str> {
        vec!["user_id", "since"]
    }
    fn cells(&self) -> Vec<String> {
        vec![self.user_id.to_string(), self.since.clone().unwrap_or_default()]
    }
}

/// A user's counters as printed.
#[derive(Debug, Clone, Serialize)]
pub struct CountersRow {
    /// The user.
    pub user_id: i64,
    /// Accounts the user follows.
    pub followings: u64,
    /// Accounts following the user.
    pub followers: u64,
    /// Published entities.
    pub posts: u64,
    /// Likes on the user's entities.
    pub likes_received: u64,
    /// Favourites on the user's entities.
    pub favs_received: u64,
}

impl TableRow for CountersRow {
    fn header() -> Vec<&'static str> {
        vec!["user_id", "followings", "followers", "posts", "likes_received", "favs_received"]
    }
    fn cells(&self) -> Vec<String> {
        let counts = [self.followings, self.followers, self.posts, self.likes_received, self.favs_received];
        std::iter::once(self.user_id.to_string()).chain(counts.iter().map(u64::to_string)).collect()
    }
}

/// An entity's counts as printed.
#[derive(Debug, Clone, Serialize)]
pub struct EntityRow {
    /// Kind of entity.
    pub entity_type: String,
    /// The entity.
    pub entity_id: i64,
    /// Likes.
    pub likes: u64,
    /// Favourites.
    pub favs: u64,
}

impl TableRow for EntityRow {
    fn header() -> Vec<&'static str> {
        vec!["entity_type", "entity_id", "likes", "favs"]
    }
    fn cells(&self) -> Vec<String> {
        vec![self.entity_type.clone(), self.entity_id.to_string(), self.likes.to_string(), self.favs.to_string()]
    }
}

/// One partition of projection-svc's status as printed.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRow {
    /// Kafka topic.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// Next offset to apply.
    pub next_offset: i64,
    /// High watermark at the last fetch.
    pub high_watermark: i64,
    /// Records not yet applied.
    pub lag: i64,
    /// Occurrence time of the last applied event.
    pub last_event_time: Option<String>,
}

impl TableRow for PartitionRow {
    fn header() -> Vec<&'static str> {
        vec!["topic", "partition", "next_offset", "high_watermark", "lag", "last_event_time"]
    }
    fn cells(&self) -> Vec<String> {
        vec![
            self.topic.clone(),
            self.partition.to_string(),
            self.next_offset.to_string(),
            self.high_watermark.to_string(),
            self.lag.to_string(),
            self.last_event_time.clone().unwrap_or_default(),
        ]
    }
}

/// `(label, value)` pairs as a two-column table (summaries).
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    for (k, v) in pairs {
        t.add_row(vec![(*k).to_owned(), v.clone()]);
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339(1_577_836_800_123), "2020-01-01T00:00:00.123Z");
        assert_eq!(time_cell(None), "");
    }

    #[test]
    fn a_table_has_its_header_and_cells() {
        let rows = [FollowRow { user_id: 42, followed_at: Some(rfc3339(0)) }];
        let t = table(&rows);
        assert!(t.contains("user_id") && t.contains("42") && t.contains("1970-01-01T00:00:00.000Z"), "{t}");
    }
}
