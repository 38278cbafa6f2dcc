//! The two token-checked steps, release and refresh, on whichever path the
//! server supports.
//!
//! Both steps compare the key's value with our token and act only on a match,
//! in one atomic step on the server, so a holder whose lease expired can never
//! delete or extend its successor's lock.
//!
//! Redis 8.4 has both as plain commands: `DELEX key IFEQ token` deletes the
//! key only if it holds `token`, and `SET key token IFEQ token PX ttl` resets
//! the expiry only if it holds `token` (and, unlike `PEXPIRE`, never creates
//! a key). Older servers get the same step as a Lua script
//! (`scripts/release.lua`, `scripts/refresh.lua`), sent as `EVALSHA` with an
//! `EVAL` of the source when the script cache is empty.
//!
//! A node decides once, lazily, on its first release or refresh:
//! `INFO server` reporting `redis_version` 8.4 or later picks the commands.
//! Anything else picks Lua, which is correct on every server: an older
//! version, an `INFO` the server refuses (ACLs) or answers in a shape we do
//! not parse (a cluster answering per node), a Redis-compatible server that
//! reports an old version for compatibility. Detection never fails a call: a
//! detection that timed out or found Redis unreachable is not remembered (the
//! next call asks again) and that call uses Lua. If a server that claimed 8.4
//! then refuses `DELEX` or `SET ... IFEQ` as unknown syntax, the locker
//! switches to Lua for good and sends the step again.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use redis::{Cmd, Value};

use crate::call::ttl_millis;
use crate::error::{Error, Result};
use crate::scripts;
use crate::token::LeaseToken;

/// How a locker sends the token-checked steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// `DELEX ... IFEQ` and `SET ... IFEQ` (Redis 8.4+).
    Commands,
    /// `scripts/release.lua` and `scripts/refresh.lua`.
    Lua,
}

/// The path a locker has settled on; starts undecided (0).
#[derive(Debug, Default)]
pub(crate) struct Detected(AtomicU8);

impl Detected {
    const COMMANDS: u8 = 1;
    const LUA: u8 = 2;

    pub(crate) fn get(&self) -> Option<Path> {
        match self.0.load(Ordering::Relaxed) {
            Self::COMMANDS => Some(Path::Commands),
            Self::LUA => Some(Path::Lua),
            _ => None,
        }
    }

    pub(crate) fn set(&self, path: Path) {
        let v = match path {
            Path::Commands => Self::COMMANDS,
            Path::Lua => Self::LUA,
        };
        self.0.store(v, Ordering::Relaxed);
    }
}

/// One token-checked step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Delete the key if it holds our token.
    Release,
    /// Reset the key's TTL to `ttl` if it holds our token.
    Refresh {
        /// The new TTL.
        ttl: Duration,
    },
}

impl Step {
    pub(crate) fn op(self) -> &'static str {
        match self {
            Step::Release => "release",
            Step::Refresh { .. } => "refresh",
        }
    }

    fn script(self) -> (&'static redis::Script, &'static str) {
        match self {
            Step::Release => (&scripts::RELEASE, scripts::RELEASE_LUA),
            Step::Refresh { .. } => (&scripts::REFRESH, scripts::REFRESH_LUA),
        }
    }

    /// The command this step is sent as on `path`. `fence`, for a refresh
    /// of a fenced lock, is its counter's key and how long the counter lives
    /// after this use (ms, not 0): the refresh then keeps it alive too,
    /// which only the script can (so `path` must be [`Path::Lua`]; see
    /// [`Step::path`]).
    pub(crate) fn cmd(
        self,
        path: Path,
        key: &str,
        token: &LeaseToken,
        fence: Option<(&str, u64)>,
    ) -> Cmd {
        match (self, self.path(path, fence)) {
            (Step::Release, Path::Commands) => {
                let mut cmd = sized("DELEX", key);
                cmd.arg(key).arg("IFEQ").arg(token);
                cmd
            }
            (Step::Refresh { ttl }, Path::Commands) => {
                let mut cmd = sized("SET", key);
                cmd.arg(key)
                    .arg(token)
                    .arg("IFEQ")
                    .arg(token)
                    .arg("PX")
                    .arg(ttl_millis(ttl));
                cmd
            }
            (_, Path::Lua) => {
                let mut cmd = sized("EVALSHA", key);
                cmd.arg(self.script().0.get_hash());
                self.lua_args(&mut cmd, key, token, fence);
                cmd
            }
        }
    }

    /// The path this step takes on a node that settled on `path`: a
    /// refresh that keeps a fence counter alive is the script's alone.
    pub(crate) fn path(self, path: Path, fence: Option<(&str, u64)>) -> Path {
        match (self, fence) {
            (Step::Refresh { .. }, Some(_)) => Path::Lua,
            _ => path,
        }
    }

    /// `EVAL` of the script's source, for a server whose script cache does
    /// not have it (`NOSCRIPT`). `EVAL` also caches it for the next call.
    pub(crate) fn eval_cmd(self, key: &str, token: &LeaseToken, fence: Option<(&str, u64)>) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.script().1);
        self.lua_args(&mut cmd, key, token, fence);
        cmd
    }

    fn lua_args(self, cmd: &mut Cmd, key: &str, token: &LeaseToken, fence: Option<(&str, u64)>) {
        match (self, fence) {
            (Step::Refresh { ttl }, Some((fence_key, fence_ttl_ms))) => {
                cmd.arg(2)
                    .arg(key)
                    .arg(fence_key)
                    .arg(token)
                    .arg(ttl_millis(ttl))
                    .arg(fence_ttl_ms);
            }
            (Step::Refresh { ttl }, None) => {
                cmd.arg(1).arg(key).arg(token).arg(ttl_millis(ttl));
            }
            (Step::Release, _) => {
                cmd.arg(1).arg(key).arg(token);
            }
        }
    }

    /// Whether the reply says the key held our token (and the step acted).
    pub(crate) fn acted(self, path: Path, reply: &Value) -> Result<bool> {
        match (self, path, reply) {
            (Step::Refresh { .. }, Path::Commands, Value::Okay) => Ok(true),
            (Step::Refresh { .. }, Path::Commands, Value::Nil) => Ok(false),
            (Step::Release, _, Value::Int(n))
            | (Step::Refresh { .. }, Path::Lua, Value::Int(n)) => Ok(*n == 1),
            _ => Err(Error::UnexpectedReply { op: self.op() }),
        }
    }
}

/// The command `name` with room for the arguments of any step on `key`
/// (the longest: `EVALSHA`, a 40-digit hash, `1`, the key, the token, a
/// TTL), so that building it never grows its buffers.
fn sized(name: &str, key: &str) -> Cmd {
    let mut cmd = Cmd::with_capacity(7, 128 + key.len());
    cmd.arg(name);
    cmd
}

/// Whether an `INFO server` reply names a server with `DELEX` and
/// `SET ... IFEQ` (Redis 8.4 or later). `None` when it names no version.
pub(crate) fn supports_commands(info: &str) -> Option<bool> {
    let version = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))?;
    let mut parts = version.trim().split('.').map(str::parse::<u32>);
    let major = parts.next()?.ok()?;
    let minor = parts.next().and_then(|m| m.ok()).unwrap_or(0);
    Some((major, minor) >= (8, 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    fn token() -> LeaseToken {
        LeaseToken::generate().expect("os rng")
    }

    #[test]
    fn release_on_redis_8_4_is_delex_ifeq() {
        let t = token();
        let cmd = Step::Release.cmd(Path::Commands, "lock:a", &t, None);
        assert_eq!(args(&cmd), ["DELEX", "lock:a", "IFEQ", t.as_str()]);
    }

    #[test]
    fn refresh_on_redis_8_4_is_set_ifeq_px() {
        let t = token();
        let step = Step::Refresh {
            ttl: Duration::from_micros(1500),
        };
        let cmd = step.cmd(Path::Commands, "lock:a", &t, None);
        assert_eq!(
            args(&cmd),
            ["SET", "lock:a", t.as_str(), "IFEQ", t.as_str(), "PX", "2"]
        );
        // Never NX/XX/GET/KEEPTTL: the only condition is the token.
        assert!(
            !args(&cmd)
                .iter()
                .any(|a| ["NX", "XX", "GET", "KEEPTTL"].contains(&a.as_str()))
        );
    }

    #[test]
    fn lua_path_sends_evalsha_with_one_key_then_eval_of_the_source() {
        let t = token();
        let cmd = Step::Release.cmd(Path::Lua, "lock:a", &t, None);
        assert_eq!(
            args(&cmd),
            [
                "EVALSHA",
                scripts::RELEASE.get_hash(),
                "1",
                "lock:a",
                t.as_str()
            ]
        );
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(2),
        };
        let cmd = refresh.cmd(Path::Lua, "lock:a", &t, None);
        assert_eq!(
            args(&cmd),
            [
                "EVALSHA",
                scripts::REFRESH.get_hash(),
                "1",
                "lock:a",
                t.as_str(),
                "2000"
            ]
        );
        let eval = refresh.eval_cmd("lock:a", &t, None);
        assert_eq!(
            args(&eval),
            [
                "EVAL",
                scripts::REFRESH_LUA,
                "1",
                "lock:a",
                t.as_str(),
                "2000"
            ]
        );
        // A fenced refresh keeps its counter alive: the script, on every
        // server, with both keys.
        let fenced = Some(("fence:a", 86_400_000));
        for path in [Path::Commands, Path::Lua] {
            assert_eq!(
                args(&refresh.cmd(path, "lock:a", &t, fenced)),
                [
                    "EVALSHA",
                    scripts::REFRESH.get_hash(),
                    "2",
                    "lock:a",
                    "fence:a",
                    t.as_str(),
                    "2000",
                    "86400000"
                ]
            );
        }
        // The refresh script extends; it never deletes.
        assert!(scripts::REFRESH_LUA.contains("PEXPIRE"));
        assert!(!scripts::REFRESH_LUA.contains("\"DEL\""));
    }

    #[test]
    fn replies_map_to_outcomes() {
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(1),
        };
        assert!(refresh.acted(Path::Commands, &Value::Okay).expect("ok"));
        assert!(!refresh.acted(Path::Commands, &Value::Nil).expect("nil"));
        assert!(refresh.acted(Path::Lua, &Value::Int(1)).expect("1"));
        assert!(!refresh.acted(Path::Lua, &Value::Int(0)).expect("0"));
        assert!(
            Step::Release
                .acted(Path::Commands, &Value::Int(1))
                .expect("1")
        );
        assert!(!Step::Release.acted(Path::Lua, &Value::Int(0)).expect("0"));
        assert!(matches!(
            refresh.acted(Path::Lua, &Value::Okay),
            Err(Error::UnexpectedReply { op: "refresh" })
        ));
    }

    #[test]
    fn version_detection() {
        let info = |v: &str| format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n");
        assert_eq!(supports_commands(&info("7.0.15")), Some(false));
        assert_eq!(supports_commands(&info("8.2.1")), Some(false));
        assert_eq!(supports_commands(&info("8.4.0")), Some(true));
        assert_eq!(supports_commands(&info("8.6")), Some(true));
        assert_eq!(supports_commands(&info("10.0.0")), Some(true));
        assert_eq!(supports_commands("# Server\r\nno version here\r\n"), None);
        assert_eq!(supports_commands(&info("garbage")), None);
    }
}
