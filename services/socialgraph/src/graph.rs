//! What the mesh should answer for a [`FollowGraph`]: degrees, and lists in the services'
//! order — newest follow first, ties by the listed user's id descending (the keyset order
//! (followed_at_ms, peer_id) descending of the storage layer).

use std::collections::{HashMap, HashSet};

use crate::edges::FollowGraph;

/// One list entry: the listed user and the follow time that orders the list (ms).
pub type Entry = (i64, i64);

/// Followings and followers of every user of a graph, each list newest first.
#[derive(Debug, Default)]
pub struct Adjacency {
    following: HashMap<i64, Vec<Entry>>,
    followers: HashMap<i64, Vec<Entry>>,
}

fn newest_first(list: &mut [Entry]) {
    list.sort_unstable_by_key(|e| std::cmp::Reverse((e.1, e.0)));
}

impl Adjacency {
    /// Builds both directions of `graph`'s edges.
    pub fn new(graph: &FollowGraph) -> Self {
        let mut adj = Self::default();
        for e in &graph.edges {
            adj.following.entry(e.follower_id).or_default().push((e.followee_id, e.followed_at_ms));
            adj.followers.entry(e.followee_id).or_default().push((e.follower_id, e.followed_at_ms));
        }
        adj.following.values_mut().for_each(|l| newest_first(l));
        adj.followers.values_mut().for_each(|l| newest_first(l));
        adj
    }

    /// Accounts `user` follows, with its follow times, newest first (ListFollowing).
    pub fn following(&self, user: i64) -> &[Entry] {
        self.following.get(&user).map_or(&[], Vec::as_slice)
    }

    /// Accounts following `user`, with their follow times, newest first (ListFollowers).
    pub fn followers(&self, user: i64) -> &[Entry] {
        self.followers.get(&user).map_or(&[], Vec::as_slice)
    }

    /// (followings, followers) of `user`: out-degree and in-degree.
    pub fn degrees(&self, user: i64) -> (u64, u64) {
        (self.following(user).len() as u64, self.followers(user).len() as u64)
    }

    /// Accounts `viewer` follows that follow `user`, ordered by the viewer's follow time, newest
    /// first (ListFamiliarFollowers), by brute force.
    pub fn familiar(&self, viewer: i64, user: i64) -> Vec<Entry> {
        let of_user: HashSet<i64> = self.followers(user).iter().map(|e| e.0).collect();
        self.following(viewer).iter().filter(|e| of_user.contains(&e.0)).copied().collect()
    }

    /// Accounts both `user` and `other` follow, ordered by `user`'s follow time, newest first
    /// (ListCommonFollowing).
    pub fn common(&self, user: i64, other: i64) -> Vec<Entry> {
        let of_other: HashSet<i64> = self.following(other).iter().map(|e| e.0).collect();
        self.following(user).iter().filter(|e| of_other.contains(&e.0)).copied().collect()
    }

    /// Users with at least one follower, ascending.
    pub fn followed_users(&self) -> Vec<i64> {
        let mut v: Vec<i64> = self.followers.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edges::{EdgeFileOptions, EdgeFormat, parse_follows};

    fn graph(text: &str) -> FollowGraph {
        parse_follows(text.as_bytes(), "t", EdgeFileOptions { format: EdgeFormat::Csv, id_offset: 0 }).unwrap()
    }

    #[test]
    fn lists_are_newest_first_with_ties_by_descending_id() {
        // 2, 3 and 4 follow 1; 3 and 4 at the same second, 2 later.
        let g = graph("3,1,1,100\n4,1,1,100\n2,1,1,200\n1,2,1,50\n");
        let adj = Adjacency::new(&g);
        assert_eq!(adj.followers(1), [(2, 200_000), (4, 100_000), (3, 100_000)]);
        assert_eq!(adj.following(1), [(2, 50_000)]);
        assert_eq!(adj.degrees(1), (1, 3));
        assert_eq!(adj.degrees(9), (0, 0));
        assert_eq!(adj.followed_users(), [1, 2]);
    }

    #[test]
    fn familiar_and_common_follow_the_viewers_order() {
        // Viewer 10 follows 1, 2, 3 (in that time order); 1 and 3 follow 20; 2 does not.
        let g = graph("10,1,1,1\n10,2,1,2\n10,3,1,3\n1,20,1,4\n3,20,1,5\n2,30,1,6\n11,3,1,7\n11,1,1,8\n");
        let adj = Adjacency::new(&g);
        assert_eq!(adj.familiar(10, 20), [(3, 3000), (1, 1000)]);
        assert!(adj.familiar(20, 10).is_empty());
        assert_eq!(adj.common(10, 11), [(3, 3000), (1, 1000)]);
        assert_eq!(adj.common(11, 10), [(1, 8000), (3, 7000)]);
    }
}
