use super::*;

fn groups(pipe: &Pipeline) -> Vec<Vec<usize>> {
    slot_groups(&pipe.cmd_iter().collect::<Vec<_>>())
}

#[test]
fn slots_follow_the_cluster_specification() {
    // CLUSTER KEYSLOT foo is 12182; the specification's CRC16 check value is 0x31C3.
    assert_eq!(slot_of(b"foo"), 12182);
    assert_eq!(slot_of(b"123456789"), 0x31C3 % SLOTS);
    // Only the first {…} counts, and only when not empty.
    assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"{user1000}.followers"));
    assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
    assert_eq!(slot_of(b"foo{}{bar}"), crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % SLOTS);
    assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
}

#[test]
fn commands_of_one_hash_tag_stay_together_in_pipeline_order() {
    let mut pipe = redis::pipe();
    pipe.hset("sg:{7}:c", 7, 1).get("sg:{8}:c").del("sg:{7}:f").zadd("sg:{7}:g", "m", 1).get("sg:{8}:x");
    assert_eq!(groups(&pipe), vec![vec![0, 2, 3], vec![1, 4]]);
}

#[test]
fn a_script_is_grouped_by_its_first_key_not_by_its_sha() {
    let mut pipe = redis::pipe();
    pipe.cmd("EVALSHA").arg("abc").arg(2).arg("sg:{post:1}:s").arg("sg:{post:1}:o").arg("x");
    pipe.cmd("EVALSHA").arg("abc").arg(1).arg("sg:{post:2}:s").arg("x");
    pipe.get("sg:{post:1}:owner");
    pipe.cmd("EVALSHA").arg("abc").arg(0).arg("x");
    pipe.cmd("TIME");
    assert_eq!(groups(&pipe), vec![vec![0, 2], vec![1], vec![3, 4]]);
}

#[test]
fn script_loads_and_flushes_go_to_every_primary() {
    assert!(matches!(target(redis::cmd("SCRIPT").arg("LOAD").arg("return 1")), Target::All));
    assert!(matches!(target(&redis::cmd("FLUSHALL")), Target::All));
    assert!(matches!(target(&redis::cmd("PING")), Target::Any));
    assert!(matches!(target(redis::cmd("GET").arg("{u}:c")), Target::Slot(s) if s == slot_of(b"u")));
}

#[test]
fn the_slot_map_is_read_from_cluster_slots() {
    let node = |host: &str, port: i64| Value::Array(vec![Value::BulkString(host.into()), Value::Int(port), Value::BulkString(b"id".to_vec())]);
    let reply = Value::Array(vec![
        Value::Array(vec![Value::Int(0), Value::Int(5460), node("10.0.0.1", 7000), node("10.0.0.9", 7009)]),
        Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
    ]);
    let map = slot_map(reply, "10.0.0.2").unwrap();
    assert_eq!(map[0].as_deref(), Some("10.0.0.1:7000"));
    assert_eq!(map[5460].as_deref(), Some("10.0.0.1:7000"));
    assert_eq!(map[5461].as_deref(), Some("10.0.0.2:7001"), "an empty host is the node asked");
    assert_eq!(map[16383].as_deref(), Some("10.0.0.2:7001"));
}

#[test]
fn an_empty_pipeline_has_no_group() {
    assert!(groups(&redis::pipe()).is_empty());
}

#[test]
fn a_cluster_url_must_name_its_nodes_as_host_and_port() {
    let config = ConnectionManagerConfig::new;
    assert!(Cluster::new("10.0.0.1:7000,10.0.0.2:7001/", "", config()).is_ok());
    for bad in ["", ",", "10.0.0.1", "10.0.0.1:", ":7000", "10.0.0.1:http", "10.0.0.1:7000/0"] {
        let e = Cluster::new(bad, "", config()).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidClientConfig, "{bad}: {e}");
    }
}
