//! Setting keys, from a configuration's code and from the configuration reference's tables.

use std::collections::BTreeSet;

use serde::Serialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

/// The dotted key of every setting `config` serializes (`cache.fill_slots`); a nested table is
/// a section, anything else (a list, a string, an enum) one setting.
///
/// # Errors
/// The configuration does not serialize.
pub fn serialized_keys<T: Serialize>(config: &T) -> serde_json::Result<BTreeSet<String>> {
    fn walk(value: &serde_json::Value, path: &str, out: &mut BTreeSet<String>) {
        match value {
            serde_json::Value::Object(map) if !map.is_empty() || path.is_empty() => {
                for (key, v) in map {
                    let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                    walk(v, &at, out);
                }
            }
            serde_json::Value::Object(_) => {}
            _ => {
                out.insert(path.to_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&serde_json::to_value(config)?, "", &mut out);
    Ok(out)
}

/// The field names a struct's `Deserialize` accepts, read from serde's derive (which hands them
/// to `deserialize_struct`). Settings that are never serialized (secrets) are found this way.
pub fn struct_fields<T: DeserializeOwned>() -> Vec<&'static str> {
    struct Fields(Vec<&'static str>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields read")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(self, _: &'static str, fields: &'static [&'static str], _: V) -> Result<V::Value, Stop> {
            self.0.extend_from_slice(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields = Fields(Vec::new());
    let _ = T::deserialize(&mut fields);
    fields.0
}

/// The setting keys in the tables of the `## <title>` section of the configuration reference:
/// (key, environment variable) of each row whose first cell is a backticked key, and the second
/// cell's variable when it is one.
pub fn documented(page: &str, title: &str) -> Vec<(String, Option<String>)> {
    let page = format!("\n{page}");
    let Some(start) = page.find(&format!("\n## {title}\n")) else { return Vec::new() };
    let body = &page[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    body[..end]
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix('|')?.split('|').map(str::trim);
            let key = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            let env = cells.next().and_then(|c| c.strip_prefix("`SG_")).and_then(|c| c.strip_suffix('`')).map(|c| format!("SG_{c}"));
            Some((key.to_owned(), env))
        })
        .collect()
}

/// The environment variable of a key: `SG_<SECTION>__<KEY>`.
pub fn env_name(key: &str) -> String {
    format!("SG_{}", key.to_uppercase().replace('.', "__"))
}
