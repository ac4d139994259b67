//! "The newer version wins": the rule every copy of versioned state applies — the follower
//! table and its counts, the block and mute copies, the counters in Redis, the unread counts
//! (docs/src/architecture/events.md#effectively-once).
//!
//! It has one definition here and one table of cases, [`NEWER_WINS`]. The Rust paths call
//! [`newer_wins`]; the SQL statements and Lua scripts that apply the rule where the data lives
//! (a conditional upsert, a script that compares inside Redis) are checked against the same
//! table by the test `newer_wins_everywhere`, on PostgreSQL, MariaDB, SQLite and Redis.

/// Whether a copy holding version `stored` (`None`: nothing yet) takes a change of version
/// `incoming`. Versions start at 1; a producer that keeps none sends 0, which never applies.
/// An equal version is a copy of the same change and changes nothing.
pub fn newer_wins(stored: Option<i64>, incoming: i64) -> bool {
    incoming > 0 && stored.is_none_or(|s| incoming > s)
}

/// The cases every implementation of the rule must agree on: (stored version, incoming
/// version, whether the incoming change applies).
pub const NEWER_WINS: &[(Option<i64>, i64, bool)] = &[
    (None, 1, true),
    (None, 9, true),
    (Some(1), 1, false),
    (Some(1), 2, true),
    (Some(5), 1, false),
    (Some(5), 4, false),
    (Some(5), 5, false),
    (Some(5), 6, true),
    (Some(5), 1_000_000_000_000, true),
    (Some(1_000_000_000_000), 999_999_999_999, false),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_agrees_with_its_table() {
        for &(stored, incoming, applies) in NEWER_WINS {
            assert_eq!(newer_wins(stored, incoming), applies, "stored {stored:?}, incoming {incoming}");
        }
        assert!(!newer_wins(None, 0), "an unversioned change never applies");
    }
}
