//! Every Redis key socialgraph writes, in one place (docs/src/architecture/counters.md#redis-layout
//! and docs/src/architecture/caches.md#list-caches). Keys that one script
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

    /// `sg:flw:{uid}`: sorted set of the user's followings in the cache Redis (member: followee
    /// id as 8 big-endian bytes, score: followed_at ms); see [`crate::lists`].
    pub fn following(&self, user_id: i64) -> String {
        format!("{}sg:flw:{{{user_id}}}", self.prefix)
    }

    /// `sg:flw:{uid}:v`: hash beside [`Self::following`]: member → signed edge version, `_s`
    /// (fill state), `_n` (members). Same slot.
    pub fn following_versions(&self, user_id: i64) -> String {
        format!("{}sg:flw:{{{user_id}}}:v", self.prefix)
    }

    /// `sg:fan:{uid}`: sorted set of the user's newest followers in the cache Redis (member:
    /// follower id as 8 big-endian bytes, score: followed_at ms); see [`crate::lists`].
    pub fn followers(&self, user_id: i64) -> String {
        format!("{}sg:fan:{{{user_id}}}", self.prefix)
    }

    /// `sg:fan:{uid}:v`: hash beside [`Self::followers`], as [`Self::following_versions`].
    pub fn followers_versions(&self, user_id: i64) -> String {
        format!("{}sg:fan:{{{user_id}}}:v", self.prefix)
    }

    /// `sg:pst:{uid}`: sorted set of the author's newest posts in the cache Redis (member: post
    /// id as 8 big-endian bytes, score: created_at ms), with `…:v` beside it as
    /// [`Self::following_versions`]; see [`crate::lists`].
    pub fn posts(&self, author_id: i64) -> String {
        format!("{}sg:pst:{{{author_id}}}", self.prefix)
    }

    /// The three keys of one cached list: sorted set, versions hash and relationship hash
    /// (`…:r`, candidate → `version:followed_at`, and `_h`), of the following list or the
    /// followers.
    pub fn list(&self, following: bool, user_id: i64) -> [String; 3] {
        Self::list_of(if following { self.following(user_id) } else { self.followers(user_id) })
    }

    /// The three keys of the cached list whose sorted set is `set` (see [`Self::list`]).
    pub fn list_of(set: String) -> [String; 3] {
        let (versions, relationships) = (format!("{set}:v"), format!("{set}:r"));
        [set, versions, relationships]
    }

    /// `sg:rst:{uid}`: the user's restriction summary in the cache Redis (a string; see
    /// [`crate::restrictions`]).
    pub fn restrictions(&self, user_id: i64) -> String {
        format!("{}sg:rst:{{{user_id}}}", self.prefix)
    }

    /// `sg:capp:{consumer}`: hash partition → next offset of the last batch the consumer
    /// applied to the list caches (see [`crate::lists::AppliedMark`]).
    pub fn cache_applied(&self, consumer: &str) -> String {
        format!("{}sg:capp:{{{consumer}}}", self.prefix)
    }

    /// `sg:uc:{u:B}`: the hash bucket holding the counters of the users of bucket `B =
    /// user_bucket(uid)` (see [`crate::counters`]): field = the user id in decimal, value = the
    /// user's packed counters with their guard version and check rest period
    /// ([`crate::counters::Stored`]). Many users share one small hash, which Redis keeps in its
    /// compact listpack encoding.
    pub fn user_counters(&self, user_id: i64) -> String {
        format!("{}sg:uc:{}", self.prefix, user_tag(user_id))
    }

    /// `sg:posts:{u:B}:uid`: set of `etype:eid` the user has published and not deleted (the
    /// fact behind the posts counter). Same slot as the user's counters.
    pub fn user_posts(&self, user_id: i64) -> String {
        format!("{}sg:posts:{}:{user_id}", self.prefix, user_tag(user_id))
    }

    /// `sg:postt:{u:B}:uid`: hash `etype:eid` → time (ms) of the last content event applied
    /// to the entity, negative for a deletion (orders duplicates and late copies).
    pub fn user_post_times(&self, user_id: i64) -> String {
        format!("{}sg:postt:{}:{user_id}", self.prefix, user_tag(user_id))
    }

    /// `sg:recv:{u:B}:uid`: hash `etype:eid` → `seq:likes:favs`, the owned entity's counts as
    /// last copied with its toggle sequence; likes and favs received are its sums.
    pub fn user_received(&self, user_id: i64) -> String {
        format!("{}sg:recv:{}:{user_id}", self.prefix, user_tag(user_id))
    }

    /// `sg:unread:{u:B}:uid`: hash of the user's unread message counts: field = conversation
    /// id in decimal, value = `version:count` as last copied from message-svc; field `t` = their
    /// sum; field `b` = 1 once the whole hash was built from message-svc (a hash without it was
    /// lost or only partly written, and is rebuilt on read). Same slot as the user's counters.
    pub fn user_unread(&self, user_id: i64) -> String {
        format!("{}sg:unread:{}:{user_id}", self.prefix, user_tag(user_id))
    }

    /// `sg:own:{etype:eid}`: the author id of a published entity (the content registry).
    pub fn owner(&self, entity_type: &str, entity_id: i64) -> String {
        format!("{}sg:own:{{{entity_type}:{entity_id}}}", self.prefix)
    }

    /// `sg:pending:entities`: sorted set of `etype:eid` scored by the time (ms) of their last
    /// toggle: the index of the entities whose outbox may hold events. A toggle registers its
    /// entity before the script that flips the fact and appends the event; the relay removes an
    /// entity once its outbox is empty and it has been quiet for a while.
    pub fn pending_entities(&self) -> String {
        format!("{}sg:pending:entities", self.prefix)
    }

    /// `sg:relay:counter`: the like/fav relay's lease (holder id, expires unless renewed).
    pub fn relay_lease(&self) -> String {
        format!("{}sg:relay:counter", self.prefix)
    }

    /// `sg:coff:{consumer}`: hash `topic/partition` → next offset of a Redis-backed consumer.
    pub fn consumer_offsets(&self, consumer: &str) -> String {
        format!("{}sg:coff:{{{consumer}}}", self.prefix)
    }
}

/// Keys of one entity's like/fav facts and counts (in the adaptive layout of [`crate::entities`],
/// docs/src/architecture/counters.md#likes-and-favourites-adaptive-facts); all share the hash tag
/// `{etype:eid}`, so one script can touch them atomically.
#[derive(Debug, Clone)]
pub struct EntityKeys {
    prefix: String,
    tag: String,
}

impl EntityKeys {
    /// `sg:bm:{etype:eid}:{metric}:{chunk}`: bitmap chunk of actors `chunk * 32768 ..`.
    pub fn chunk(&self, metric: &str, chunk: u64) -> String {
        format!("{}{chunk}", self.chunk_prefix(metric))
    }
    /// Prefix of the chunk keys of `metric` (scripts append the chunk id).
    pub fn chunk_prefix(&self, metric: &str) -> String {
        format!("{}sg:bm:{}:{metric}:", self.prefix, self.tag)
    }
    /// `sg:bms:{etype:eid}:{metric}`: the metric's spill set (8-byte big-endian actor ids), used
    /// only while the actors outgrow the state's arrays (see [`crate::entities`]).
    pub fn spill(&self, metric: &str) -> String {
        format!("{}sg:bms:{}:{metric}", self.prefix, self.tag)
    }
    /// `sg:ent:{etype:eid}`: the entity's state string: toggle sequence, like and fav counts,
    /// and the small arrays and chunk list of both metrics (format in [`crate::entities`]).
    pub fn state(&self) -> String {
        format!("{}sg:ent:{}", self.prefix, self.tag)
    }
    /// `sg:obx:{etype:eid}`: list, the entity's outbox: one entry per fact change, appended by
    /// the toggle script in the same step as the change, removed by the relay once the broker
    /// acknowledged it (`seq|actor|owner|metric|delta|time_ms|traceparent`).
    pub fn outbox(&self) -> String {
        format!("{}sg:obx:{}", self.prefix, self.tag)
    }
}

impl Keys {
    /// The keys of entity `etype:eid`.
    pub fn entity(&self, entity_type: &str, entity_id: i64) -> EntityKeys {
        EntityKeys { prefix: self.prefix.clone(), tag: format!("{{{entity_type}:{entity_id}}}") }
    }
}

/// The hash tag `{u:B}` of a user's keys: `B` is [`crate::counters::user_bucket`].
fn user_tag(user_id: i64) -> String {
    format!("{{u:{}}}", crate::counters::user_bucket(user_id))
}

/// The field naming one partition of one topic in guard and offset hashes.
pub fn partition_field(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}
