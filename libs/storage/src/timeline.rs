//! Reads of a home timeline's parts (see `projection::feed::read` for how a page merges them).
//! A part is read inside a [`Window`]: keys strictly between two bounds, in either order, so the
//! default walk down from the newest post, the walk up from a post a client already has and the
//! walk down that ends at such a post share one statement per part.

use sea_orm::{ConnectionTrait, DbErr};

use crate::feed::{FeedEntry, FeedKey, entry, ids, newer_than, not_older_than, older_than, query};

/// Which part of a timeline [`timeline_part`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Inbox rows at or above the floor whose post is live and whose author the user follows.
    Inbox,
    /// Pulled live posts of followed authors at or above the floor.
    Pulled,
    /// Every live post of followed authors below the floor.
    BelowFloor,
}

/// The keys a read covers, and the order it lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Only keys strictly newer than this one (`None`: no lower bound).
    pub after: Option<FeedKey>,
    /// Only keys strictly older than this one (`None`: no upper bound).
    pub before: Option<FeedKey>,
    /// Oldest first; else newest first.
    pub ascending: bool,
}

impl Window {
    /// Whether the window holds keys below `floor` (the part [`Part::BelowFloor`] can hold).
    pub fn reaches_below(&self, floor: FeedKey) -> bool {
        floor != FeedKey::MIN && self.after.is_none_or(|a| a < floor)
    }

    /// Whether the window holds keys at or above `floor` ([`Part::Inbox`], [`Part::Pulled`]).
    pub fn reaches_above(&self, floor: FeedKey) -> bool {
        self.before.is_none_or(|b| b > floor)
    }

    /// Sorts `entries` in the window's order (equal keys next to each other).
    pub fn sort(&self, entries: &mut [FeedEntry]) {
        if self.ascending {
            entries.sort_by_key(|e| e.key);
        } else {
            entries.sort_by_key(|e| std::cmp::Reverse(e.key));
        }
    }

    fn conditions(&self, alias: &str) -> String {
        let mut sql = String::new();
        if let Some(a) = self.after {
            sql.push_str(&format!(" AND {}", newer_than(alias, a)));
        }
        if let Some(b) = self.before {
            sql.push_str(&format!(" AND {}", older_than(alias, b)));
        }
        sql
    }

    fn order(&self, alias: &str) -> String {
        let dir = if self.ascending { "ASC" } else { "DESC" };
        format!(" ORDER BY {alias}.created_at_ms {dir}, {alias}.post_id {dir}")
    }
}

/// Up to `limit` entries of one part of `user_id`'s timeline inside `window`, in its order,
/// leaving out the authors in `muted`.
///
/// # Errors
/// Database errors.
pub async fn timeline_part<C: ConnectionTrait>(
    conn: &C,
    part: Part,
    user_id: i64,
    floor: FeedKey,
    window: Window,
    muted: &[i64],
    limit: usize,
) -> Result<Vec<FeedEntry>, DbErr> {
    let mut sql = match part {
        Part::Inbox => format!(
            "SELECT i.created_at_ms, i.post_id, i.author_id FROM inbox i \
             JOIN post p ON p.post_id = i.post_id \
             JOIN follower f ON f.followee_id = i.author_id AND f.follower_id = i.user_id \
             WHERE i.user_id = {user_id} AND p.deleted = 0 AND f.state = 1 AND {}",
            not_older_than("i", floor)
        ),
        Part::Pulled | Part::BelowFloor => format!(
            "SELECT p.created_at_ms, p.post_id, p.author_id FROM follower f \
             JOIN post p ON p.author_id = f.followee_id \
             WHERE f.follower_id = {user_id} AND f.state = 1 AND p.deleted = 0 AND {}",
            if part == Part::Pulled { format!("p.pushed = 0 AND {}", not_older_than("p", floor)) } else { older_than("p", floor) }
        ),
    };
    let alias = if part == Part::Inbox { "i" } else { "p" };
    sql.push_str(&window.conditions(alias));
    if !muted.is_empty() {
        sql.push_str(&format!(" AND {alias}.author_id NOT IN ({})", ids(muted.iter().copied())));
    }
    sql.push_str(&window.order(alias));
    sql.push_str(&format!(" LIMIT {limit}"));
    query(conn, sql).await?.iter().map(entry).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ms: i64, id: i64) -> FeedKey {
        FeedKey { created_at_ms: ms, post_id: id }
    }

    #[test]
    fn a_window_reaches_the_parts_its_bounds_overlap() {
        let floor = key(100, 5);
        let all = Window::default();
        assert!(all.reaches_below(floor) && all.reaches_above(floor));
        assert!(!all.reaches_below(FeedKey::MIN), "an inbox never trimmed has nothing below its floor");
        let up_from_above = Window { after: Some(key(100, 5)), ..all };
        assert!(!up_from_above.reaches_below(floor), "strictly after the floor: nothing below it");
        let up_from_below = Window { after: Some(key(100, 4)), ..all };
        assert!(up_from_below.reaches_below(floor) && up_from_below.reaches_above(floor));
        let down_from_floor = Window { before: Some(key(100, 5)), ..all };
        assert!(!down_from_floor.reaches_above(floor), "strictly before the floor: nothing at or above it");
        assert!(Window { before: Some(key(100, 6)), ..all }.reaches_above(floor));
    }

    #[test]
    fn a_window_sorts_in_its_order() {
        let e = |ms, id| FeedEntry { key: key(ms, id), author_id: 1 };
        let mut v = vec![e(2, 1), e(1, 9), e(2, 3)];
        Window { ascending: true, ..Window::default() }.sort(&mut v);
        assert_eq!(v, [e(1, 9), e(2, 1), e(2, 3)]);
        Window::default().sort(&mut v);
        assert_eq!(v, [e(2, 3), e(2, 1), e(1, 9)]);
    }
}
