//! A local Redis Cluster comes up with every slot served.

use leasehold_testkit::{Failover, RedisCluster};

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
    assert_eq!(cluster.owner_of(12182)?, 2);
    cluster.begin_slot_migration(12182, 2, 0)?;
    assert_eq!(cluster.owner_of(12182)?, 2, "migrating, not moved yet");
    cluster.finish_slot_migration(12182, 2, 0)?;
    assert_eq!(cluster.owner_of(12182)?, 0);
    cluster.begin_slot_migration(12182, 0, 2)?;
    cluster.finish_slot_migration(12182, 0, 2)?;
    assert_eq!(owner.port(), cluster.nodes()[2].port());
    assert_eq!(owner.redis_cli(&["SET", "foo", "bar"])?, "OK");
    let moved = cluster.nodes()[0].redis_cli(&["SET", "foo", "bar"]);
    assert!(format!("{moved:?}").contains("MOVED"), "{moved:?}");
    Ok(())
}

/// With replicas, `failover` promotes master i's replica: it then serves
/// the master's slots (with the data it had replicated), and the old
/// master redirects to it.
#[test]
fn a_failover_promotes_the_replica_with_the_slots_and_the_data()
-> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::start_with_replicas(3)?;
    assert_eq!(cluster.replicas().len(), 3);
    for replica in cluster.replicas() {
        assert!(replica.redis_cli(&["ROLE"])?.starts_with("slave"));
    }
    let (master, replica) = (&cluster.nodes()[2], &cluster.replicas()[2]);
    assert_eq!(master.redis_cli(&["SET", "foo", "bar"])?, "OK");
    master.redis_cli(&["WAIT", "1", "5000"])?;

    let slot = cluster.slot_of("foo")?;
    assert_eq!(cluster.owner_of(slot)?, 2);
    let promoted = cluster.failover(2, Failover::Coordinated)?;
    assert_eq!(cluster.owner_of(slot)?, 2, "the pair still serves it");
    assert_eq!(promoted, replica.port());
    assert!(replica.redis_cli(&["ROLE"])?.starts_with("master"));
    assert_eq!(replica.redis_cli(&["GET", "foo"])?, "bar");
    let moved = master.redis_cli(&["SET", "foo", "baz"]);
    assert!(format!("{moved:?}").contains("MOVED"), "{moved:?}");

    // And back at once, with a takeover (no vote needed): the old master
    // is the replica now.
    assert_eq!(cluster.failover(2, Failover::Takeover)?, master.port());
    Ok(())
}
