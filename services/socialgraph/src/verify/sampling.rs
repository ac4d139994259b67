//! Which users and pairs a verification looks at: seeded, so the same seed checks the same
//! lists, and skewed towards answers that are not empty.

use rand_chacha::ChaCha8Rng;

use super::VerifyOptions;
use crate::edges::FollowGraph;
use crate::graph::Adjacency;
use crate::rng::{below, sample, seeded};

/// The random parts of a verification: users whose follower lists are compared and
/// (viewer, user) pairs whose familiar followers are compared.
pub fn sample_checks(graph: &FollowGraph, adj: &Adjacency, opts: &VerifyOptions) -> (Vec<i64>, Vec<(i64, i64)>) {
    let mut rng = seeded(opts.seed);
    let followed = adj.followed_users();
    // Users first, then pairs, from the one stream: the order fixes what a seed selects.
    let users = sample_users(&mut rng, graph, adj, &followed, opts.sample_users);
    let pairs = sample_pairs(&mut rng, graph, adj, &followed, opts.sample_pairs);
    (users, pairs)
}

/// `n` followed users at random, the most-followed one first and, when there is one, a user
/// nobody follows second.
fn sample_users(rng: &mut ChaCha8Rng, graph: &FollowGraph, adj: &Adjacency, followed: &[i64], n: usize) -> Vec<i64> {
    let mut users = sample(rng, followed, n);
    if let Some(top) = followed.iter().copied().max_by_key(|u| (adj.followers(*u).len(), std::cmp::Reverse(*u))) {
        match users.iter().position(|u| *u == top) {
            Some(i) => users.swap(0, i),
            None if !users.is_empty() => users[0] = top,
            None => {}
        }
    }
    if let Some(nobody) = graph.users.iter().find(|u| adj.followers(**u).is_empty())
        && users.len() > 1
    {
        users[1] = *nobody;
    }
    users
}

/// `n` (viewer, user) pairs: nine in ten through [`two_hop_pair`], the tenth uniform.
fn sample_pairs(rng: &mut ChaCha8Rng, graph: &FollowGraph, adj: &Adjacency, followed: &[i64], n: usize) -> Vec<(i64, i64)> {
    let mut pairs = Vec::with_capacity(n);
    if followed.is_empty() || graph.users.is_empty() {
        return pairs;
    }
    let uniform = |rng: &mut ChaCha8Rng| graph.users[below(rng, graph.users.len())];
    for i in 0..n {
        if i % 10 == 9 {
            let viewer = uniform(rng);
            pairs.push((viewer, uniform(rng)));
            continue;
        }
        let pair = match two_hop_pair(rng, adj, followed) {
            Some(p) => p,
            None => (uniform(rng), followed[below(rng, followed.len())]),
        };
        pairs.push(pair);
    }
    pairs
}

/// A followed user and, as viewer, a follower of one of its followers, so that the viewer
/// follows at least one of the user's followers. Tries a few times for a middle account that
/// has followers of its own; `None` when none was found.
fn two_hop_pair(rng: &mut ChaCha8Rng, adj: &Adjacency, followed: &[i64]) -> Option<(i64, i64)> {
    for _ in 0..8 {
        let user = followed[below(rng, followed.len())];
        let middle = adj.followers(user)[below(rng, adj.followers(user).len())].0;
        let of_middle = adj.followers(middle);
        if !of_middle.is_empty() {
            return Some((of_middle[below(rng, of_middle.len())].0, user));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edges::{EdgeFileOptions, EdgeFormat, parse_follows};
    use crate::generator::{GenOptions, generate};

    fn generated() -> FollowGraph {
        let text: String = generate(GenOptions { users: 2000, edges: 20_000, seed: 3 }).unwrap().iter().map(|(a, b)| format!("{a}\t{b}\n")).collect();
        parse_follows(text.as_bytes(), "g", EdgeFileOptions { format: EdgeFormat::Snap, id_offset: 0 }).unwrap()
    }

    #[test]
    fn samples_are_seeded_include_the_top_user_and_mostly_nonempty_pairs() {
        let g = generated();
        let adj = Adjacency::new(&g);
        let opts = VerifyOptions::default();
        let (users, pairs) = sample_checks(&g, &adj, &opts);
        assert_eq!((users.len(), pairs.len()), (200, 200));
        assert_eq!(sample_checks(&g, &adj, &opts), (users.clone(), pairs.clone()), "same seed, same sample");
        let top = adj.followed_users().into_iter().max_by_key(|u| adj.followers(*u).len()).unwrap();
        assert_eq!(adj.followers(users[0]).len(), adj.followers(top).len(), "the most-followed user is checked");
        let nonempty = pairs.iter().filter(|(v, u)| !adj.familiar(*v, *u).is_empty()).count();
        assert!(nonempty >= 150, "most pairs have familiar followers: {nonempty} of 200");
    }
}
