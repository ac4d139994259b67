//! Every Redis key socialgraph writes, in one place (DESIGN.md §5). Keys that one script
//! touches together share a `{hash tag}` so that they live in one Redis Cluster slot.
//! All keys start with a configurable prefix (empty in production; unique per test).

/// Builds keys under a prefix.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (e.g. `""`, or `"t42:"` in a test).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self { prefix: prefix.into() }
    }

    /// `sg:rl:follow:{uid}`: the follower's follow token bucket (a hash: tokens, ts).
    pub fn follow_rate_limit(&self, user_id: i64) -> String {
        format!("{}sg:rl:follow:{{{user_id}}}", self.prefix)
    }
}
