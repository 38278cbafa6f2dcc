//! `--redis-url redis+sentinel://...`: the experiments run on the primary
//! the sentinels name; errors are typed and never show the password.

use leasehold_testkit::RedisSentinel;
use serde_json::Value;

mod common;
use common::leasehold;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn a_sentinel_url_runs_the_experiments_on_the_primary() -> TestResult {
    let setup = RedisSentinel::start("cli-master")?;
    let url = setup.url();
    for args in [
        ["lock", "--redis-url", &url, "--json"].as_slice(),
        ["backoff", "--handoff", "--redis-url", &url, "--json"].as_slice(),
    ] {
        let out = leasehold(args)?;
        let (stdout, stderr) = (
            String::from_utf8(out.stdout)?,
            String::from_utf8(out.stderr)?,
        );
        assert!(out.status.success(), "{args:?}: {stderr}");
        let r: Value = serde_json::from_str(stdout.trim())?;
        assert_eq!(r["ok"], true, "{args:?}: {stdout}");
        assert!(!stderr.contains("throwaway"), "started its own: {stderr}");
    }
    // The experiment wrote on the primary.
    assert_ne!(
        setup.primary()?.redis_cli(&["GET", "wallet:42:balance"])?,
        "(nil)"
    );

    // A wrong master name is named; a password is never shown.
    let wrong = url
        .replace("/cli-master", "/no-such-master")
        .replace("redis+sentinel://", "redis+sentinel://:wrong-secret@");
    let out = leasehold(&["lock", "--redis-url", &wrong])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("no master named \"no-such-master\""),
        "{stderr}"
    );
    assert!(
        !stderr.contains("wrong-secret"),
        "password leaked: {stderr}"
    );
    assert!(stderr.contains(":***@"), "{stderr}");

    let out = leasehold(&["lock", "--redis-url", "redis+sentinel://127.0.0.1:1"])?;
    assert_eq!(out.status.code(), Some(2), "a url without the master name");
    Ok(())
}
