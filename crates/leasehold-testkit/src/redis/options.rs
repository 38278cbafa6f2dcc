//! How a server is started: [`RedisOptions`], its setters, and the
//! command line they make.

use std::path::Path;
use std::time::Duration;

use crate::certs::{ClientAuth, ServerTls};
use crate::process::HOST;

/// Options for [`RedisServer::start_with`], built with consuming setters.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_testkit::{RedisOptions, RedisServer};
///
/// let server = RedisServer::start_with(
///     RedisOptions::default()
///         .password("s3cret")
///         .args(["--maxmemory", "64mb"])
///         .ready_timeout(Duration::from_secs(5)),
/// )?;
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
///
/// [`RedisServer::start_with`]: super::RedisServer::start_with
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(super) password: Option<String>,
    pub(super) replica_of: Option<(String, u16)>,
    pub(super) appendonly: bool,
    pub(super) args: Vec<String>,
    pub(super) ready_timeout: Duration,
    pub(super) tls: Option<ServerTls>,
    pub(super) fake_clock: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            password: None,
            replica_of: None,
            appendonly: false,
            args: Vec::new(),
            ready_timeout: Duration::from_secs(10),
            tls: None,
            fake_clock: false,
        }
    }
}

/// Where a TLS server's PEM files live in its directory.
pub(super) const TLS_FILES: [&str; 5] = [
    "tls-cert.pem",
    "tls-key.pem",
    "tls-ca.pem",
    "tls-client-cert.pem",
    "tls-client-key.pem",
];

impl RedisOptions {
    /// Requires clients to authenticate with `password` (`--requirepass`).
    ///
    /// Combined with [`replica_of`](Self::replica_of), the same password is
    /// used to authenticate to the primary (`--masterauth`).
    #[must_use]
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Starts the server as a replica of `host:port` (`--replicaof`).
    #[must_use]
    pub fn replica_of(mut self, host: &str, port: u16) -> Self {
        self.replica_of = Some((host.to_owned(), port));
        self
    }

    /// Turns on the append-only file with an fsync after every write
    /// (`--appendonly yes --appendfsync always`), so every write the server
    /// acknowledged survives [`kill`](super::RedisServer::kill) and
    /// [`restart`](super::RedisServer::restart). Defaults to off (no persistence).
    #[must_use]
    pub fn appendonly(mut self) -> Self {
        self.appendonly = true;
        self
    }

    /// Appends one raw command-line argument, e.g. `"--cluster-enabled"`.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several raw command-line arguments, e.g.
    /// `["--cluster-enabled", "yes"]`.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long to wait for the server to answer `PING` (default 10 s).
    #[must_use]
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Serves TLS only: the server listens on its port with TLS
    /// (`--tls-port PORT --port 0`), presents `tls`'s certificate, and
    /// verifies client certificates against its CA as its
    /// [`ClientAuth`](crate::ClientAuth) says (`--tls-auth-clients`).
    /// [`RedisServer::url`] is then `rediss://...`, and
    /// [`RedisServer::command`] (and the readiness check) speak TLS,
    /// trusting the CA that signed the server's certificate and presenting
    /// the client certificate of the same [`TestCerts`](crate::TestCerts).
    ///
    /// With [`replica_of`](Self::replica_of) the replica connects to its
    /// primary over TLS too (`--tls-replication yes`), presenting the
    /// testkit's client certificate (`--tls-client-cert-file`), so the
    /// primary must speak TLS with the same [`TestCerts`](crate::TestCerts).
    /// Not for cluster nodes: the cluster bus stays plain.
    ///
    /// Defaults to none: a plain TCP server.
    ///
    /// [`RedisServer::command`]: super::RedisServer::command
    ///
    /// [`RedisServer::url`]: super::RedisServer::url
    #[must_use]
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Runs the server on a wall clock the test can move: under
    /// libfaketime (preloaded, its setting in a file of the server's
    /// directory, re-read on every call), so that
    /// [`RedisServer::jump_clock`] steps it forward and
    /// [`RedisServer::set_clock_rate`] makes it run fast, which moves
    /// when Redis expires keys. The server's monotonic clock is left
    /// alone. A [restart](super::RedisServer::restart) keeps the offset and rate
    /// last set.
    ///
    /// The start checks that the server follows: its `TIME` must show a
    /// one-day offset set for a moment, then the real time again. Not
    /// every binary does: Debian's `redis-server` (linked with jemalloc)
    /// hangs at start under libfaketime; a libc-malloc build such as
    /// `scripts/valkey.sh`'s Valkey follows (select it with
    /// [`SERVER_ENV`]).
    ///
    /// Needs libfaketime (`scripts/install-deps.sh`, Debian's
    /// `libfaketime` package). Defaults to off: the machine's clock.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold_testkit::{RedisOptions, RedisServer};
    ///
    /// let server = RedisServer::start_with(RedisOptions::default().fake_clock())?;
    /// server.redis_cli(&["SET", "lease", "t", "PX", "5000"])?;
    /// server.jump_clock(Duration::from_secs(10))?;
    /// assert_eq!(server.redis_cli(&["GET", "lease"])?, "(nil)");
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// [`SERVER_ENV`]: super::SERVER_ENV
    ///
    /// [`RedisServer::set_clock_rate`]: super::RedisServer::set_clock_rate
    ///
    /// [`RedisServer::jump_clock`]: super::RedisServer::jump_clock
    #[must_use]
    pub fn fake_clock(mut self) -> Self {
        self.fake_clock = true;
        self
    }

    /// Whether [`fake_clock`](Self::fake_clock) is on.
    pub fn get_fake_clock(&self) -> bool {
        self.fake_clock
    }

    /// The password set with [`password`](Self::password), if any.
    pub fn get_password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The TLS settings set with [`tls`](Self::tls), if any.
    pub fn get_tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// The primary set with [`replica_of`](Self::replica_of), if any.
    pub fn get_replica_of(&self) -> Option<(&str, u16)> {
        self.replica_of
            .as_ref()
            .map(|(host, port)| (host.as_str(), *port))
    }

    /// Whether [`appendonly`](Self::appendonly) is on.
    pub fn get_appendonly(&self) -> bool {
        self.appendonly
    }

    /// The full `redis-server` command line (without the binary) for a server
    /// on `port` whose files live in `dir`.
    pub(super) fn command_line(&self, port: u16, dir: &Path, log_path: &Path) -> Vec<String> {
        let (plain_port, tls_args) = match &self.tls {
            None => (port.to_string(), Vec::new()),
            Some(tls) => {
                let [cert, key, ca, client_cert, client_key] = TLS_FILES.map(|name| dir.join(name));
                let auth = match tls.client_auth {
                    ClientAuth::Optional => "optional",
                    ClientAuth::Required => "yes",
                    _ => "no",
                };
                let tls_args = [
                    "--tls-port",
                    &port.to_string(),
                    "--tls-cert-file",
                    &cert.to_string_lossy(),
                    "--tls-key-file",
                    &key.to_string_lossy(),
                    "--tls-ca-cert-file",
                    &ca.to_string_lossy(),
                    "--tls-auth-clients",
                    auth,
                    // What it presents when it connects out: to its primary.
                    "--tls-client-cert-file",
                    &client_cert.to_string_lossy(),
                    "--tls-client-key-file",
                    &client_key.to_string_lossy(),
                    "--tls-replication",
                    if self.replica_of.is_some() {
                        "yes"
                    } else {
                        "no"
                    },
                ]
                .map(str::to_owned)
                .to_vec();
                ("0".to_owned(), tls_args)
            }
        };
        let mut args: Vec<String> = [
            "--port",
            &plain_port,
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            if self.appendonly { "yes" } else { "no" },
            "--dir",
            &dir.to_string_lossy(),
            "--logfile",
            &log_path.to_string_lossy(),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        args.extend(tls_args);
        if self.appendonly {
            args.extend(["--appendfsync".to_owned(), "always".to_owned()]);
        }
        if let Some(password) = &self.password {
            args.extend(["--requirepass".to_owned(), password.clone()]);
        }
        if let Some((host, primary_port)) = &self.replica_of {
            args.extend([
                "--replicaof".to_owned(),
                host.clone(),
                primary_port.to_string(),
            ]);
            if let Some(password) = &self.password {
                args.extend(["--masterauth".to_owned(), password.clone()]);
            }
        }
        args.extend(self.args.iter().cloned());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_has_fixed_args_then_options() {
        let options = RedisOptions::default()
            .password("pw")
            .replica_of("127.0.0.1", 7000)
            .arg("--maxmemory")
            .args(["64mb"]);
        let args = options.command_line(6400, Path::new("/d"), Path::new("/d/redis.log"));
        let expected = [
            "--port",
            "6400",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/d",
            "--logfile",
            "/d/redis.log",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--requirepass",
            "pw",
            "--replicaof",
            "127.0.0.1",
            "7000",
            "--masterauth",
            "pw",
            "--maxmemory",
            "64mb",
        ];
        assert_eq!(args, expected);
    }
}
