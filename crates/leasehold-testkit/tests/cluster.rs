//! A local Redis Cluster comes up with every slot served.

use leasehold_testkit::RedisCluster;

#[test]
fn three_masters_serve_all_slots() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::start(3)?;
    assert_eq!(cluster.nodes().len(), 3);
    for node in cluster.nodes() {
        let info = node.redis_cli(&["CLUSTER", "INFO"])?;
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    // "foo" hashes to slot 12182, served by the third node.
    let owner = cluster.node_for_slot(12182).ok_or("no node")?;
    assert_eq!(owner.port(), cluster.nodes()[2].port());
    assert_eq!(owner.redis_cli(&["SET", "foo", "bar"])?, "OK");
    let moved = cluster.nodes()[0].redis_cli(&["SET", "foo", "bar"]);
    assert!(format!("{moved:?}").contains("MOVED"), "{moved:?}");
    Ok(())
}
