//! The two token-checked steps, release and refresh, on whichever path the
//! server supports.
//!
//! Both steps compare the key's value with our token and act only on a match,
//! in one atomic step on the server, so a holder whose lease expired can never
//! delete or extend its successor's lock.
//!
//! Some servers have them as plain commands, and each step takes its own
//! path, since a server may have one and not the other:
//!
//! | server | refresh | release |
//! |---|---|---|
//! | Redis 8.4 or later | `SET key token IFEQ token PX ttl` | `DELEX key IFEQ token` |
//! | Valkey 9.0 or later | `SET key token IFEQ token PX ttl` | `DELIFEQ key token` |
//! | Valkey 8.1 | `SET key token IFEQ token PX ttl` | Lua |
//! | anything else | Lua | Lua |
//!
//! `SET ... IFEQ` resets the expiry only if the key holds `token`, and
//! (unlike `PEXPIRE`) never creates a key: a missing key or another value
//! answers nil and is left as it was. `DELEX ... IFEQ` and `DELIFEQ` delete
//! the key only if it holds `token` and answer 1, else 0. Every other case
//! gets the same step as a Lua script (`scripts/release.lua`,
//! `scripts/refresh.lua`), sent as `EVALSHA` with an `EVAL` of the source
//! when the script cache is empty. A refresh of a fenced lock is the
//! script's on every server: it also keeps the fence counter alive.
//!
//! A node decides once, lazily, on its first release or refresh, from
//! `INFO server`: `valkey_version` when the reply has it (Valkey reports
//! `redis_version:7.2.4` whatever its version, for compatibility), else
//! `redis_version`. Anything else picks Lua, which is correct on every
//! server: an older version, an `INFO` the server refuses (ACLs) or
//! answers in a shape we do not parse (a cluster answering per node), a
//! Redis-compatible server that reports an old version for compatibility.
//! Detection never fails a call: a detection that timed out or found Redis
//! unreachable is not remembered (the next call asks again) and that call
//! uses Lua.
//!
//! The commands are then trusted no further than they answer. A command
//! the server refuses is sent again as the script, and that step stays on
//! Lua for good: unknown command or syntax (a server that claimed a
//! version it does not have), `NOPERM` (an ACL with `+info` but without
//! `+delex`, `+delifeq` or `+set`: the script needs only what the README's
//! minimal ACL grants), or any other error that trying again would not
//! cure. `OOM` is sent again as the script for that call only: `SET` is
//! refused under `maxmemory` (it may grow the data set) where the script's
//! `PEXPIRE` is not, and the next call tries the command again. A
//! `WRONGTYPE` key, or a fault that may pass (`LOADING`, `READONLY`, a
//! timeout, ...), is reported as the script's would be.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use redis::{Cmd, Value};

use crate::call::ttl_millis;
use crate::error::{Error, Result};
use crate::scripts;
use crate::service::Service;
use crate::token::LeaseToken;

/// How a node sends one token-checked step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// `SET key token IFEQ token PX ttl`: a refresh (Redis 8.4+, Valkey
    /// 8.1+).
    SetIfeq,
    /// `DELEX key IFEQ token`: a release (Redis 8.4+).
    Delex,
    /// `DELIFEQ key token`: a release (Valkey 9.0+).
    Delifeq,
    /// `scripts/release.lua` or `scripts/refresh.lua`: every server.
    Lua,
}

impl Path {
    fn code(self) -> u8 {
        match self {
            Path::SetIfeq => 1,
            Path::Delex => 2,
            Path::Delifeq => 3,
            Path::Lua => 4,
        }
    }

    fn from_code(code: u8) -> Option<Path> {
        [Path::SetIfeq, Path::Delex, Path::Delifeq, Path::Lua]
            .into_iter()
            .find(|path| path.code() == code)
    }
}

/// The path of each step on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Paths {
    /// How a release is sent.
    pub(crate) release: Path,
    /// How a refresh of an unfenced lock is sent.
    pub(crate) refresh: Path,
}

impl Paths {
    /// The scripts for both steps: correct on every server.
    pub(crate) const LUA: Paths = Paths {
        release: Path::Lua,
        refresh: Path::Lua,
    };

    /// The paths the server that sent an `INFO server` reply supports (see
    /// the module docs). `None` when the reply names no version we can
    /// read.
    pub(crate) fn from_info(info: &str) -> Option<Paths> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        // Valkey's own version first: its `redis_version` is a
        // compatibility claim (7.2.4), not what it has.
        if let Some(valkey) = field("valkey_version") {
            let version = major_minor(valkey)?;
            return Some(Paths {
                release: if version >= (9, 0) {
                    Path::Delifeq
                } else {
                    Path::Lua
                },
                refresh: if version >= (8, 1) {
                    Path::SetIfeq
                } else {
                    Path::Lua
                },
            });
        }
        let version = major_minor(field("redis_version")?)?;
        Some(if version >= (8, 4) {
            Paths {
                release: Path::Delex,
                refresh: Path::SetIfeq,
            }
        } else {
            Paths::LUA
        })
    }
}

/// `8.1` of `8.1.8` (a missing minor is 0; what follows the minor's digits,
/// such as a patch level or `-rc1`, is ignored).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        None => 0,
        Some(minor) => {
            let digits = minor.find(|c: char| !c.is_ascii_digit());
            minor[..digits.unwrap_or(minor.len())].parse().ok()?
        }
    };
    Some((major, minor))
}

/// The paths a node has settled on, one per step; each starts undecided
/// (0).
#[derive(Debug, Default)]
pub(crate) struct Detected {
    release: AtomicU8,
    refresh: AtomicU8,
}

impl Detected {
    /// Both steps' paths, once detected.
    pub(crate) fn get(&self) -> Option<Paths> {
        Some(Paths {
            release: Path::from_code(self.release.load(Ordering::Relaxed))?,
            refresh: Path::from_code(self.refresh.load(Ordering::Relaxed))?,
        })
    }

    /// Records a detection, for each step still undecided: a step that
    /// fell back to Lua meanwhile stays there.
    pub(crate) fn settle(&self, paths: Paths) {
        for (slot, path) in [
            (&self.release, paths.release),
            (&self.refresh, paths.refresh),
        ] {
            let _ = slot.compare_exchange(0, path.code(), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Sends `step` as the script from now on.
    pub(crate) fn fall_back(&self, step: Step) {
        let slot = match step {
            Step::Release => &self.release,
            Step::Refresh { .. } => &self.refresh,
        };
        slot.store(Path::Lua.code(), Ordering::Relaxed);
    }
}

/// What to do when a command sent instead of a script failed with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// Send the script instead, and keep this step on Lua.
    ForGood,
    /// Send the script instead, this time only.
    ThisCall,
}

impl Fallback {
    /// How a command's failure with `err` falls back to the script; `None`
    /// when the script would fail the same way (a wrong-type key) or
    /// could not have been sent either (a timeout, an unreachable server,
    /// a fault that may pass).
    pub(crate) fn of(err: &Error) -> Option<Fallback> {
        match err {
            Error::NoPermission { .. } => Some(Fallback::ForGood),
            Error::OutOfMemory { .. } => Some(Fallback::ThisCall),
            Error::Redis { .. } if !err.is_retryable() => Some(Fallback::ForGood),
            _ => None,
        }
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

    /// The command this step is sent as on `path` (as [`Step::path`]
    /// chose it). `fence`, for a refresh of a fenced lock, is its counter's
    /// key and how long the counter lives after this use (ms, not 0): the
    /// refresh then keeps it alive too, which only the script can. A path
    /// that is not this step's (or a fenced refresh on `SET ... IFEQ`) is
    /// sent as the script, which is correct everywhere.
    pub(crate) fn cmd(
        self,
        path: Path,
        key: &str,
        token: &LeaseToken,
        fence: Option<(&str, u64)>,
    ) -> Cmd {
        match (self, path, fence) {
            (Step::Release, Path::Delex, _) => {
                let mut cmd = sized("DELEX", key);
                cmd.arg(key).arg("IFEQ").arg(token);
                cmd
            }
            (Step::Release, Path::Delifeq, _) => {
                let mut cmd = sized("DELIFEQ", key);
                cmd.arg(key).arg(token);
                cmd
            }
            (Step::Refresh { ttl }, Path::SetIfeq, None) => {
                let mut cmd = sized("SET", key);
                cmd.arg(key)
                    .arg(token)
                    .arg("IFEQ")
                    .arg(token)
                    .arg("PX")
                    .arg(ttl_millis(ttl));
                cmd
            }
            _ => {
                let mut cmd = sized("EVALSHA", key);
                cmd.arg(self.script().0.get_hash());
                self.lua_args(&mut cmd, key, token, fence);
                cmd
            }
        }
    }

    /// The path this step takes on a node that settled on `paths`: a
    /// refresh that keeps a fence counter alive is the script's alone.
    pub(crate) fn path(self, paths: Paths, fence: Option<(&str, u64)>) -> Path {
        match (self, fence) {
            (Step::Release, _) => paths.release,
            (Step::Refresh { .. }, None) => paths.refresh,
            (Step::Refresh { .. }, Some(_)) => Path::Lua,
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

    /// Whether the reply to this step sent on `path` says the key held our
    /// token (and the step acted): `OK` or nil for `SET ... IFEQ`, 1 or 0
    /// for the others.
    pub(crate) fn acted(self, path: Path, reply: &Value) -> Result<bool> {
        match (self, path, reply) {
            (Step::Refresh { .. }, Path::SetIfeq, Value::Okay) => Ok(true),
            (Step::Refresh { .. }, Path::SetIfeq, Value::Nil) => Ok(false),
            (Step::Refresh { .. }, Path::SetIfeq, _) => Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: self.op(),
            }),
            (_, _, Value::Int(n)) => Ok(*n == 1),
            _ => Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: self.op(),
            }),
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
    fn release_on_redis_8_4_is_delex_ifeq_and_on_valkey_9_delifeq() {
        let t = token();
        let cmd = Step::Release.cmd(Path::Delex, "lock:a", &t, None);
        assert_eq!(args(&cmd), ["DELEX", "lock:a", "IFEQ", t.as_str()]);
        let cmd = Step::Release.cmd(Path::Delifeq, "lock:a", &t, None);
        assert_eq!(args(&cmd), ["DELIFEQ", "lock:a", t.as_str()]);
    }

    #[test]
    fn refresh_on_redis_8_4_is_set_ifeq_px() {
        let t = token();
        let step = Step::Refresh {
            ttl: Duration::from_micros(1500),
        };
        let cmd = step.cmd(Path::SetIfeq, "lock:a", &t, None);
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
        // server, with both keys (and so even if asked for SET IFEQ).
        let fenced = Some(("fence:a", 86_400_000));
        for paths in [NATIVE_REDIS, NATIVE_VALKEY, VALKEY_8_1, Paths::LUA] {
            assert_eq!(refresh.path(paths, fenced), Path::Lua);
        }
        for path in [Path::SetIfeq, Path::Lua] {
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
    fn each_step_takes_its_own_path() {
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(1),
        };
        let t = token();
        let sent = |step: Step, paths: Paths| {
            let cmd = step.cmd(step.path(paths, None), "lock:a", &t, None);
            args(&cmd)[0].clone()
        };
        for (paths, release, refreshed) in [
            (NATIVE_REDIS, "DELEX", "SET"),
            (NATIVE_VALKEY, "DELIFEQ", "SET"),
            (VALKEY_8_1, "EVALSHA", "SET"),
            (Paths::LUA, "EVALSHA", "EVALSHA"),
        ] {
            assert_eq!(sent(Step::Release, paths), release, "{paths:?}");
            assert_eq!(sent(refresh, paths), refreshed, "{paths:?}");
        }
        // A path that is not the step's own is sent as the script.
        assert_eq!(
            args(&Step::Release.cmd(Path::SetIfeq, "k", &t, None))[0],
            "EVALSHA"
        );
        assert_eq!(
            args(&refresh.cmd(Path::Delifeq, "k", &t, None))[0],
            "EVALSHA"
        );
    }

    #[test]
    fn a_fallback_stays_per_step_and_detection_does_not_undo_it() {
        let detected = Detected::default();
        assert_eq!(detected.get(), None);
        detected.settle(NATIVE_VALKEY);
        assert_eq!(detected.get(), Some(NATIVE_VALKEY));
        detected.fall_back(Step::Release);
        assert_eq!(
            detected.get(),
            Some(Paths {
                release: Path::Lua,
                refresh: Path::SetIfeq
            })
        );
        // A detection that finished late (another call's) changes nothing.
        detected.settle(NATIVE_VALKEY);
        assert_eq!(detected.get().map(|p| p.release), Some(Path::Lua));
        detected.fall_back(Step::Refresh {
            ttl: Duration::from_secs(1),
        });
        assert_eq!(detected.get(), Some(Paths::LUA));
    }

    #[test]
    fn refusals_fall_back_to_the_script_and_faults_do_not() {
        let of = |code: &str, detail: &str| {
            let reply = redis::parse_redis_value(format!("-{code} {detail}\r\n").as_bytes())
                .and_then(Value::extract_error);
            let err = reply.expect_err("an error reply");
            Fallback::of(&Error::from_redis("refresh", "k", err))
        };
        assert_eq!(
            of(
                "ERR",
                "unknown command 'DELIFEQ', with args beginning with: 'k' 't'"
            ),
            Some(Fallback::ForGood)
        );
        assert_eq!(of("ERR", "syntax error"), Some(Fallback::ForGood));
        assert_eq!(
            of(
                "NOPERM",
                "User u has no permissions to run the 'delifeq' command"
            ),
            Some(Fallback::ForGood)
        );
        assert_eq!(of("ERR", "something new"), Some(Fallback::ForGood));
        assert_eq!(
            of("OOM", "command not allowed when used memory > 'maxmemory'."),
            Some(Fallback::ThisCall)
        );
        for (code, detail) in [
            (
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            ),
            ("LOADING", "Redis is loading the dataset in memory"),
            ("READONLY", "You can't write against a read only replica."),
            ("BUSY", "Redis is busy running a script."),
        ] {
            assert_eq!(of(code, detail), None, "{code}");
        }
        let timeout = Error::Timeout {
            service: Service::REDIS,
            op: "refresh",
            after: Duration::from_secs(1),
        };
        assert_eq!(Fallback::of(&timeout), None);
    }

    #[test]
    fn replies_map_to_outcomes() {
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(1),
        };
        assert!(refresh.acted(Path::SetIfeq, &Value::Okay).expect("ok"));
        assert!(!refresh.acted(Path::SetIfeq, &Value::Nil).expect("nil"));
        assert!(refresh.acted(Path::Lua, &Value::Int(1)).expect("1"));
        assert!(!refresh.acted(Path::Lua, &Value::Int(0)).expect("0"));
        for path in [Path::Delex, Path::Delifeq, Path::Lua] {
            assert!(Step::Release.acted(path, &Value::Int(1)).expect("1"));
            assert!(!Step::Release.acted(path, &Value::Int(0)).expect("0"));
        }
        assert!(matches!(
            refresh.acted(Path::Lua, &Value::Okay),
            Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: "refresh"
            })
        ));
        assert!(matches!(
            refresh.acted(Path::SetIfeq, &Value::Int(1)),
            Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: "refresh"
            })
        ));
        assert!(matches!(
            Step::Release.acted(Path::Delifeq, &Value::Okay),
            Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: "release"
            })
        ));
    }

    const NATIVE_REDIS: Paths = Paths {
        release: Path::Delex,
        refresh: Path::SetIfeq,
    };
    const NATIVE_VALKEY: Paths = Paths {
        release: Path::Delifeq,
        refresh: Path::SetIfeq,
    };
    const VALKEY_8_1: Paths = Paths {
        release: Path::Lua,
        refresh: Path::SetIfeq,
    };

    #[test]
    fn detection_from_info() {
        let redis = |v: &str| format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n");
        assert_eq!(Paths::from_info(&redis("7.0.15")), Some(Paths::LUA));
        assert_eq!(Paths::from_info(&redis("8.2.1")), Some(Paths::LUA));
        assert_eq!(Paths::from_info(&redis("8.4.0")), Some(NATIVE_REDIS));
        assert_eq!(Paths::from_info(&redis("8.6")), Some(NATIVE_REDIS));
        assert_eq!(Paths::from_info(&redis("10.0.0")), Some(NATIVE_REDIS));
        assert_eq!(Paths::from_info("# Server\r\nno version here\r\n"), None);
        assert_eq!(Paths::from_info(&redis("garbage")), None);
        // Valkey says redis_version:7.2.4 whatever its own version.
        let valkey = |v: &str| {
            format!(
                "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{v}\r\nvalkey_release_stage:ga\r\n"
            )
        };
        assert_eq!(Paths::from_info(&valkey("7.2.5")), Some(Paths::LUA));
        assert_eq!(Paths::from_info(&valkey("8.0.2")), Some(Paths::LUA));
        assert_eq!(Paths::from_info(&valkey("8.1.0")), Some(VALKEY_8_1));
        assert_eq!(Paths::from_info(&valkey("8.1.8")), Some(VALKEY_8_1));
        assert_eq!(Paths::from_info(&valkey("9.0.0")), Some(NATIVE_VALKEY));
        assert_eq!(Paths::from_info(&valkey("9.1-rc1")), Some(NATIVE_VALKEY));
        assert_eq!(Paths::from_info(&valkey("10.0.0")), Some(NATIVE_VALKEY));
        // A Valkey version we cannot read is not taken from redis_version.
        assert_eq!(Paths::from_info(&valkey("unstable")), None);
        // Even one that claims Redis 8.4 for compatibility.
        let claims = "redis_version:8.4.0\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n";
        assert_eq!(Paths::from_info(claims), Some(VALKEY_8_1));
        // The reply of the real Valkey 8.1.8 server (scripts/valkey.sh).
        let real = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\nvalkey_release_stage:ga\r\nredis_git_sha1:00000000\r\nredis_git_dirty:1\r\nserver_mode:standalone\r\n";
        assert_eq!(Paths::from_info(real), Some(VALKEY_8_1));
    }
}
