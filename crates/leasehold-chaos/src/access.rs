//! What the lab may send to a Redis it does not own: the harness's ACL,
//! per fault, and the harmless probes that check it before a run.
//!
//! Against your own Redis ([`LabOptions::redis_url`](crate::LabOptions::redis_url),
//! [`LabOptions::cluster_urls`](crate::LabOptions::cluster_urls)) the lab
//! connects as the URL's user, the same user as the callers, and sends
//! nothing outside [`ACL_RULES`](crate::ACL_RULES) (the lock user's rules)
//! plus, for the faults that need them, [`HARNESS_ACL_RULES`]:
//!
//! | when | what the lab sends | rule |
//! |---|---|---|
//! | connecting | the connection's handshake (`AUTH` with the URL's user and password, `SELECT` for a database other than 0), then `TIME` | `+time` (lock rules) |
//! | [`Fault::KeyLoss`] | `DEL` of the run's lock keys | `+del`, `~lock:*` (lock rules) |
//! | [`Fault::EarlyExpiry`] | `PEXPIRE <lock key> 1` | `+pexpire`, `~lock:*` (lock rules) |
//! | [`Fault::ScriptFlush`] | `SCRIPT FLUSH` | `+script\|flush` |
//! | [`Fault::ConnKill`] | `CLIENT KILL TYPE normal` | `+client\|kill` |
//! | [`Fault::RedisStall`] | `CLIENT PAUSE <window> ALL` | `+client\|pause` |
//! | [`Fault::ClientPauseWrite`] | `CLIENT PAUSE <window> WRITE` | `+client\|pause` |
//! | [`Fault::PubsubKill`] | `CLIENT KILL TYPE pubsub` | `+client\|kill` |
//!
//! The lab's own connection to a single Redis skips redis-rs's `CLIENT
//! SETINFO` (a cluster client's connections may send it; redis-rs ignores
//! its refusal). No `PING`, no `INFO`, no `CONFIG`. (The callers' own
//! locker is the library's: it may ask `INFO` once, optionally, see the
//! README's "Redis ACL".) Before a run's first window, the nemesis checks
//! that the user may run the fault's commands ([`Fault::needs_commands`])
//! with a harmless form of each (`DEL`/`PEXPIRE` of a key no lock uses,
//! next to the lock key; `SCRIPT FLUSH` with an argument Redis refuses;
//! `CLIENT KILL ID 0`; `CLIENT PAUSE` with a timeout Redis refuses): a
//! `NOPERM` is [`LabError::Permission`](crate::LabError::Permission) naming
//! the command, before any fault is injected.
//!
//! On throwaway servers the lab controls, it uses the servers' default
//! user (with the password of
//! [`LabOptions::redis_options`](crate::LabOptions::redis_options), if any),
//! which may run everything.

use crate::fault::Fault;

/// What the lab's faults need beyond the lock user's
/// [`ACL_RULES`](crate::ACL_RULES) on a Redis it reaches by URL (see
/// [`Fault::needs_commands`] for which fault needs which). The harness's
/// whole ACL, as one user:
///
/// ```text
/// ACL SETUSER harness on >password <ACL_RULES> +script|flush +client|kill +client|pause
/// ```
///
/// The crate's README writes it out (`tests/tls_acl.rs` checks that the
/// two stay the same, and runs a fault under exactly that user).
pub const HARNESS_ACL_RULES: [&str; 3] = ["+script|flush", "+client|kill", "+client|pause"];

impl Fault {
    /// The Redis commands (as ACL names: `script|flush` is `SCRIPT FLUSH`)
    /// the lab sends for this fault to a Redis it reaches by URL, as the
    /// callers' user; none for the faults that send no command there.
    /// [`Fault::KeyLoss`] and [`Fault::EarlyExpiry`] need them on the lock
    /// keys. A mixed schedule needs every mixable fault's.
    pub const fn needs_commands(self) -> &'static [&'static str] {
        match self {
            Fault::KeyLoss => &["del"],
            Fault::EarlyExpiry => &["pexpire"],
            Fault::ScriptFlush => &["script|flush"],
            Fault::ConnKill => &["client|kill"],
            Fault::RedisStall | Fault::ClientPauseWrite => &["client|pause"],
            Fault::PubsubKill => &["client|kill"],
            Fault::Mixed => &[
                "del",
                "pexpire",
                "script|flush",
                "client|kill",
                "client|pause",
            ],
            _ => &[],
        }
    }

    /// True when the callers must reach Redis through the lab's fault
    /// proxy for this fault: the network faults, and a failover (the proxy
    /// moves the callers to the promoted replica).
    pub const fn needs_proxy(self) -> bool {
        matches!(
            self,
            Fault::NetLatency
                | Fault::NetCut
                | Fault::NetBlackhole
                | Fault::Failover
                | Fault::Mixed
        )
    }
}

/// A harmless form of `command` (a [`Fault::needs_commands`] name) that
/// Redis checks against the user's ACL like the real one: an `Err` with
/// `NOPERM` means the user may not run it. `key` is a lock key.
pub(crate) fn probe(command: &str, key: &str) -> Option<Vec<String>> {
    let probe_key = format!("{key}:leasehold-acl-probe");
    let args: Vec<&str> = match command {
        "del" => vec!["DEL", &probe_key],
        "pexpire" => vec!["PEXPIRE", &probe_key, "1"],
        // Redis checks the ACL before the argument, which it refuses.
        "script|flush" => vec!["SCRIPT", "FLUSH", "LEASEHOLD-ACL-PROBE"],
        // No client has id 0: nothing is killed.
        "client|kill" => vec!["CLIENT", "KILL", "ID", "0"],
        "client|pause" => vec!["CLIENT", "PAUSE", "LEASEHOLD-ACL-PROBE"],
        _ => return None,
    };
    Some(args.into_iter().map(str::to_owned).collect())
}
