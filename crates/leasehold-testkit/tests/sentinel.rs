//! The Sentinel setup: sentinels agree on the primary, follow a
//! coordinated failover and a killed primary.

use std::time::Duration;

use leasehold_testkit::RedisSentinel;

#[test]
fn sentinels_follow_a_failover_then_a_killed_primary() {
    let mut setup = RedisSentinel::start("tk-master").expect("start");
    let first = setup.primary_port().expect("primary");
    assert_eq!(first, setup.servers()[0].port());
    assert!(setup.url().starts_with("redis+sentinel://127.0.0.1:"));
    assert!(setup.url().ends_with("/tk-master"));

    let second = setup.failover().expect("failover");
    assert_eq!(second, setup.servers()[1].port());
    assert_eq!(
        setup
            .primary()
            .expect("primary")
            .redis_cli(&["SET", "k", "v"])
            .expect("write"),
        "OK"
    );

    // The old primary was reconfigured as a replica of the new one. While
    // it switches it drops its clients (the ROLE request then ends with
    // EOF): not yet demoted, ask again.
    let old = &setup.servers()[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !old
        .redis_cli(&["ROLE"])
        .is_ok_and(|role| role.starts_with("slave"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "old primary never demoted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let killed = setup.kill_primary().expect("kill");
    assert_eq!(killed, second);
    let third = setup
        .wait_for_new_primary(killed, Duration::from_secs(30))
        .expect("failover after the kill");
    assert_eq!(third, first);
}
