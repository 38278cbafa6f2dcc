//! A TCP proxy that injects network faults between clients and a server:
//! [`FaultProxy`], whose docs say what each fault does and guarantees.
//!
//! # Why not Toxiproxy or `noxious`
//!
//! A Toxiproxy-compatible library was preferred, so `noxious` (the Rust port
//! of Toxiproxy) was examined first. Its last release, 1.0.4, dates from
//! April 2021, with no release since. It builds here, but brings about fifty
//! crates, among them second copies of ones the workspace already uses in
//! newer versions (`tokio-util` 0.6, `rand` 0.8, `thiserror` 1, `syn` 1).
//! Its core crate can in principle be embedded, but what it exposes is the
//! server's internals (a `ProxyRunner` driven over a `bmrng` request
//! channel, with stop and close signals and a tokio runtime to run it on),
//! not a documented library API; `noxious-client` only talks to a running
//! server over HTTP, which would mean shipping and starting a server binary
//! in CI. It also lacks two of the faults needed here: Toxiproxy closes the
//! listener to refuse connections (so another process may take the port)
//! and has no "close the open connections but keep accepting". Toxiproxy's
//! own semantics are kept where they exist: upstream means client to
//! server, downstream server to client, latency applies per chunk. The
//! blackhole departs from Toxiproxy's `timeout` toxic, which drops bytes
//! from a connection that lives on: no real network does that (TCP
//! retransmits until it gives up and resets), and a request lost from a
//! live connection desynchronises a pipelined protocol such as RESP, whose
//! replies are matched to requests by order (seen with `leasehold chaos`:
//! every later request got the previous one's reply). Here a blackhole
//! holds bytes back and delivers them, in order, when it heals.
//!
//! So this is a small proxy of its own, in keeping with the rest of the
//! crate (std and threads, no async runtime): one thread accepts, and each
//! connection has a reading and a writing thread per direction.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::Error;
use crate::process::POLL_INTERVAL;

/// How long connecting to the upstream may take before the client's
/// connection is closed.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long dropping the proxy waits to wake its accepting thread.
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// The most bytes read from a socket at once.
const CHUNK_SIZE: usize = 16 * 1024;

/// Which way bytes flow through a [`FaultProxy`], in Toxiproxy's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the upstream server (requests).
    Upstream,
    /// From the upstream server to the client (replies).
    Downstream,
    /// Both ways.
    Both,
}

/// The faults a [`FaultProxy`] currently applies; all off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Faults {
    /// Added to every chunk going from the client to the upstream.
    pub latency_upstream: Duration,
    /// Added to every chunk going from the upstream to the client.
    pub latency_downstream: Duration,
    /// Whether bytes are dropped in both directions.
    pub blackhole: bool,
    /// Whether new connections are closed as soon as they are accepted.
    pub refuse: bool,
    /// Whether the proxy reads nothing from the client (a stopped client
    /// sends nothing).
    pub frozen_upstream: bool,
    /// Whether the proxy reads nothing from the upstream (a stopped
    /// client reads nothing).
    pub frozen_downstream: bool,
}

/// A TCP proxy that injects network faults between clients and a server.
///
/// It listens on a free loopback port and forwards every connection to one
/// upstream address (a redis-server, a PostgreSQL server,
/// anything speaking TCP). The process that owns the proxy switches faults
/// on and off while traffic flows, so clients in other processes (lock
/// workers) see a network that lags, partitions or drops them:
///
/// | fault | what clients see |
/// | --- | --- |
/// | [`set_latency`](Self::set_latency) | every chunk of bytes arrives that much later, per direction |
/// | [`blackhole`](Self::blackhole) | connections stay open, nothing is delivered until it heals, nothing answers: a partition |
/// | [`cut`](Self::cut) | every open connection is closed; new ones are accepted |
/// | [`refuse`](Self::refuse) | new connections are closed as soon as they are accepted |
/// | [`freeze`](Self::freeze) | the proxy reads nothing, per direction: downstream, the server's writes fill the socket buffers, then block, as for a client stopped by `SIGSTOP` |
/// | [`heal`](Self::heal) | all of the above switched off |
///
/// It also counts the [`round_trips`](Self::round_trips) its clients
/// make, whatever the faults.
///
/// # Guarantees
///
/// - A setter takes effect for the bytes the proxy reads, and the
///   connections it accepts, after it returned; bytes already in flight
///   keep the latency they were read with.
/// - Latency delays each chunk from the moment the proxy read it; chunks are
///   delivered in order, and bytes are not lost.
/// - While the blackhole is on, nothing is delivered in either direction:
///   bytes and closes are held back, in order, and delivered when it is
///   switched off (a partition that heals before TCP gives up), unless the
///   connection is cut meanwhile (one that does not).
/// - [`cut`](Self::cut) closes (`shutdown`) both sockets of every
///   connection accepted before the call, including those still connecting
///   to the upstream: clients see end of file, or a reset if they write.
/// - The proxy never answers anything itself: if the upstream cannot be
///   reached, the client's connection is closed.
///
/// Bytes waiting out their latency are buffered without bound: the proxy is
/// meant for the request/response traffic of tests, not bulk transfers.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_testkit::{Direction, FaultProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr())?;
/// let url = format!("redis://{}/", proxy.addr()); // hand this to the workers
/// proxy.set_latency(Direction::Both, Duration::from_millis(50));
/// proxy.blackhole(true); // partition the workers from redis
/// proxy.heal();
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
///
/// Dropping it stops accepting and closes every connection; a thread still
/// holding a chunk back for latency exits once that chunk is due.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1` (a free port) forwarding to `upstream`,
    /// with no faults.
    ///
    /// The upstream is connected to once per accepted connection, so it
    /// need not be up yet.
    ///
    /// # Errors
    ///
    /// [`Error::FreePort`] if the listening socket cannot be bound,
    /// [`Error::ProxyThread`] if its thread cannot be started.
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy, Error> {
        Self::start_on(upstream, 0)
    }

    /// Like [`start`](Self::start), on `127.0.0.1:port` (0: a free port).
    ///
    /// # Errors
    ///
    /// [`Error::FreePort`] if the port cannot be bound (it is taken, or
    /// needs privileges), [`Error::ProxyThread`] if the thread cannot be
    /// started.
    pub fn start_on(upstream: SocketAddr, port: u16) -> Result<FaultProxy, Error> {
        Self::start_at(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), upstream)
    }

    /// Like [`start`](Self::start), listening on `listen` (port 0: a free
    /// one). On Linux every `127.x.y.z` address is the loopback interface,
    /// so a proxy may listen on `127.0.1.2` on the very port a server
    /// holds on `127.0.0.1`: the ZooKeeper kit's cut-off rests on that.
    ///
    /// # Errors
    ///
    /// As for [`start_on`](Self::start_on).
    pub fn start_at(listen: SocketAddr, upstream: SocketAddr) -> Result<FaultProxy, Error> {
        let listener = TcpListener::bind(listen).map_err(Error::FreePort)?;
        let addr = listener.local_addr().map_err(Error::FreePort)?;
        let shared = Arc::new(Shared::default());
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("fault-proxy-{}", addr.port()))
                .spawn(move || accept_loop(&listener, upstream, &shared))
                .map_err(Error::ProxyThread)?
        };
        Ok(FaultProxy {
            addr,
            upstream,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address new connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.lock().moved_to.unwrap_or(self.upstream)
    }

    /// Forwards connections accepted from now on to `upstream` (open ones
    /// stay where they are: [`cut`](Self::cut) them to move every client),
    /// as a DNS name or a Sentinel-aware client would after a failover.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        self.shared.lock().moved_to = Some(upstream);
    }

    /// The faults currently applied.
    pub fn faults(&self) -> Faults {
        self.shared.lock().faults
    }

    /// How many round trips clients have made through the proxy since it
    /// started, over all connections: on each connection, every run of
    /// bytes from the client that follows bytes from the server (or
    /// opens the connection) counts one. For a request/response protocol
    /// whose client waits for each answer, that is the number of requests;
    /// requests a client pipelines (sends before the answer to the first
    /// has come back) count once together, as they share one round trip.
    /// "Follows" is judged by what the proxy has delivered to the client
    /// (after any latency) when it reads the client's bytes.
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::Relaxed)
    }

    /// How many client connections are open through the proxy (accepted
    /// and neither closed by both sides nor cut).
    pub fn connections(&self) -> usize {
        self.shared.lock().conns.len()
    }

    /// Delays every chunk read from now on in `direction` by `delay`
    /// (`Duration::ZERO` removes the delay). Chunks already read keep
    /// the delay they were read with.
    pub fn set_latency(&self, direction: Direction, delay: Duration) {
        self.shared.update(|faults| {
            if matches!(direction, Direction::Upstream | Direction::Both) {
                faults.latency_upstream = delay;
            }
            if matches!(direction, Direction::Downstream | Direction::Both) {
                faults.latency_downstream = delay;
            }
        });
    }

    /// Switches the blackhole on or off. While on, connections (open and
    /// new) stay open but nothing is delivered in either direction: nothing
    /// answers, as in a network partition. What was held back is delivered
    /// when it is switched off, as TCP's retransmissions would after a short
    /// partition; [`cut`](Self::cut) the connections to model a long one.
    pub fn blackhole(&self, on: bool) {
        self.shared.update(|faults| faults.blackhole = on);
    }

    /// Switches refusing on or off. While on, new connections are closed as
    /// soon as they are accepted, before the upstream is contacted; open
    /// ones are left alone.
    ///
    /// The kernel completes the TCP handshake before the proxy sees a
    /// connection, so a client's `connect` succeeds and its first read
    /// sees end of file (or its first writes a reset), rather than
    /// "connection refused". Closing the listener instead would let
    /// another process take the port.
    pub fn refuse(&self, on: bool) {
        self.shared.update(|faults| faults.refuse = on);
    }

    /// Switches freezing on or off in `direction`. While on, the proxy
    /// reads nothing from that side of any connection, as a client
    /// stopped by `SIGSTOP` (or a paused VM) sends nothing (upstream) and
    /// reads nothing (downstream): what the server writes fills the socket
    /// buffers (a few MB on loopback), and then its writes block, in the
    /// middle of a reply if it is large enough. Freezing downstream alone
    /// lets a request through and stops its reply: a client that froze
    /// right after sending it. Bytes already read are still delivered,
    /// and a read already waiting when freezing begins still takes its
    /// next chunk (at most 16 KiB). Switching it off resumes where it
    /// stopped.
    pub fn freeze(&self, direction: Direction, on: bool) {
        self.shared.update(|faults| {
            if direction != Direction::Downstream {
                faults.frozen_upstream = on;
            }
            if direction != Direction::Upstream {
                faults.frozen_downstream = on;
            }
        });
    }

    /// Closes every open connection (both its client and its upstream
    /// socket), including connections still being set up. New connections
    /// are accepted as usual.
    pub fn cut(&self) {
        let conns = std::mem::take(&mut self.shared.lock().conns);
        self.shared.changed.notify_all();
        for conn in conns.into_values() {
            conn.shutdown();
        }
    }

    /// Switches every fault off: no latency, no blackhole, no refusing, no
    /// freezing.
    /// Connections that were cut stay closed.
    pub fn heal(&self) {
        self.shared.update(|faults| *faults = Faults::default());
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        // The accepting thread is blocked in accept(); a connection wakes it.
        // If that fails it exits on the next connection instead.
        let woken = TcpStream::connect_timeout(&self.addr, WAKE_TIMEOUT).is_ok();
        if let Some(acceptor) = self.acceptor.take()
            && woken
        {
            let _ = acceptor.join();
        }
        self.cut();
    }
}

/// State shared by the handle and the proxy's threads.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Notified whenever the faults or the set of connections change.
    changed: Condvar,
    /// See [`FaultProxy::round_trips`].
    round_trips: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    faults: Faults,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    stopped: bool,
    /// Set by [`FaultProxy::set_upstream`]; the start address otherwise.
    moved_to: Option<SocketAddr>,
}

/// The sockets of one proxied connection, kept to cut it.
#[derive(Debug)]
struct Conn {
    client: TcpStream,
    upstream: Option<TcpStream>,
}

impl Conn {
    fn shutdown(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(upstream) = &self.upstream {
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, so poisoning carries no
        // meaning here.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.lock().faults);
        self.changed.notify_all();
    }

    fn faults(&self) -> Faults {
        self.lock().faults
    }

    fn is_open(&self, id: u64) -> bool {
        self.lock().conns.contains_key(&id)
    }

    /// Blocks while the proxy is frozen in `direction` and connection `id`
    /// is open; returns whether it is still open.
    fn wait_out_freeze(&self, id: u64, direction: Direction) -> bool {
        let mut state = self.lock();
        let frozen = |faults: &Faults| match direction {
            Direction::Downstream => faults.frozen_downstream,
            Direction::Upstream | Direction::Both => faults.frozen_upstream,
        };
        while frozen(&state.faults) && state.conns.contains_key(&id) {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.conns.contains_key(&id)
    }

    /// Blocks while the blackhole is on and connection `id` is open;
    /// returns whether it is still open.
    fn wait_out_blackhole(&self, id: u64) -> bool {
        let mut state = self.lock();
        while state.faults.blackhole && state.conns.contains_key(&id) {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.conns.contains_key(&id)
    }
}

/// Removes a connection from the open set once every thread serving it has
/// finished (dropped its clone).
#[derive(Debug)]
struct Registration {
    shared: Arc<Shared>,
    id: u64,
    /// Whether the client has sent bytes since the proxy last delivered
    /// it some: its next bytes then extend the same round trip (it cannot
    /// be answering what it has not received).
    client_spoke_last: AtomicBool,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(conn) = self.shared.lock().conns.remove(&self.id) {
            conn.shutdown();
        }
        self.shared.changed.notify_all();
    }
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        let mut state = shared.lock();
        if state.stopped {
            return;
        }
        let client = match accepted {
            Ok((client, _)) => client,
            Err(_) => {
                // E.g. out of file descriptors: back off instead of spinning.
                drop(state);
                thread::sleep(POLL_INTERVAL);
                continue;
            }
        };
        if state.faults.refuse {
            continue; // dropping `client` closes it
        }
        let Ok(client_copy) = client.try_clone() else {
            continue;
        };
        let upstream = state.moved_to.unwrap_or(upstream);
        let id = state.next_id;
        state.next_id += 1;
        state.conns.insert(
            id,
            Conn {
                client: client_copy,
                upstream: None,
            },
        );
        drop(state);
        let registration = Arc::new(Registration {
            shared: Arc::clone(shared),
            id,
            client_spoke_last: AtomicBool::new(false),
        });
        // On failure the closure, holding the registration and the client,
        // is dropped, which closes the connection.
        let _ = thread::Builder::new()
            .name(format!("fault-proxy-conn-{id}"))
            .spawn(move || serve(client, upstream, &registration));
    }
}

/// Connects to the upstream and starts the threads moving bytes both ways.
fn serve(client: TcpStream, upstream: SocketAddr, registration: &Arc<Registration>) {
    let Ok(server) = TcpStream::connect_timeout(&upstream, UPSTREAM_CONNECT_TIMEOUT) else {
        return; // dropping the registration closes the client
    };
    // Requests and replies are small; do not let Nagle add latency of its own.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let Ok(sockets) = clone_sockets(&client, &server) else {
        let _ = server.shutdown(Shutdown::Both);
        return;
    };
    {
        let mut state = registration.shared.lock();
        match state.conns.get_mut(&registration.id) {
            Some(conn) => conn.upstream = Some(sockets.0),
            None => {
                // Cut while connecting.
                let _ = server.shutdown(Shutdown::Both);
                return;
            }
        }
    }
    let [client_read, client_write, server_read, server_write] = sockets.1;
    let pumping =
        pump(client_read, server_write, Direction::Upstream, registration).and_then(|()| {
            pump(
                server_read,
                client_write,
                Direction::Downstream,
                registration,
            )
        });
    if pumping.is_err() {
        abort(registration);
    }
}

type Clones = (TcpStream, [TcpStream; 4]);

fn clone_sockets(client: &TcpStream, server: &TcpStream) -> io::Result<Clones> {
    Ok((
        server.try_clone()?,
        [
            client.try_clone()?,
            client.try_clone()?,
            server.try_clone()?,
            server.try_clone()?,
        ],
    ))
}

/// What a reading thread hands its writing thread.
enum Message {
    /// Bytes to deliver at `due`.
    Chunk { bytes: Vec<u8>, due: Instant },
    /// The sender closed its side for writing (end of file).
    Eof,
    /// Reading failed (e.g. a reset): the whole connection is aborted.
    Failed,
}

/// Starts a reading and a writing thread moving bytes from `from` to `to`.
fn pump(
    from: TcpStream,
    to: TcpStream,
    direction: Direction,
    registration: &Arc<Registration>,
) -> io::Result<()> {
    let (outbox, inbox) = mpsc::channel();
    let id = registration.id;
    let reader = {
        let registration = Arc::clone(registration);
        move || read_side(from, direction, &outbox, &registration)
    };
    let writer = {
        let registration = Arc::clone(registration);
        move || write_side(&to, direction, &inbox, &registration)
    };
    thread::Builder::new()
        .name(format!("fault-proxy-read-{id}"))
        .spawn(reader)?;
    thread::Builder::new()
        .name(format!("fault-proxy-write-{id}"))
        .spawn(writer)?;
    Ok(())
}

fn read_side(
    mut from: TcpStream,
    direction: Direction,
    outbox: &Sender<Message>,
    registration: &Registration,
) {
    let shared = &registration.shared;
    let mut buf = vec![0u8; CHUNK_SIZE];
    let end = loop {
        if !shared.wait_out_freeze(registration.id, direction) {
            return;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break Message::Eof,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break Message::Failed,
        };
        if direction != Direction::Downstream
            && !registration.client_spoke_last.swap(true, Ordering::Relaxed)
        {
            shared.round_trips.fetch_add(1, Ordering::Relaxed);
        }
        let faults = shared.faults();
        let latency = match direction {
            Direction::Downstream => faults.latency_downstream,
            Direction::Upstream | Direction::Both => faults.latency_upstream,
        };
        let chunk = Message::Chunk {
            bytes: buf[..n].to_vec(),
            due: Instant::now() + latency,
        };
        if outbox.send(chunk).is_err() {
            // The writing side gave up and closed the connection.
            return;
        }
    };
    let _ = outbox.send(end);
}

fn write_side(
    mut to: &TcpStream,
    direction: Direction,
    inbox: &Receiver<Message>,
    registration: &Registration,
) {
    let shared = &registration.shared;
    let id = registration.id;
    loop {
        let end = match inbox.recv() {
            Ok(Message::Chunk { bytes, due }) => {
                let wait = due.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    thread::sleep(wait);
                }
                if !shared.is_open(id) {
                    return;
                }
                // Held, in order, until the link is back: a partition
                // shorter than TCP's retransmission timeout delays bytes,
                // it does not lose them from a connection that lives on.
                if !shared.wait_out_blackhole(id) {
                    return;
                }
                // Marked before the write: once the bytes are out, the
                // client may answer them before this thread runs again.
                if direction == Direction::Downstream {
                    registration
                        .client_spoke_last
                        .store(false, Ordering::Relaxed);
                }
                if to.write_all(&bytes).is_ok() {
                    continue;
                }
                Message::Failed
            }
            Ok(end) => end,
            // The reading side is gone without a word.
            Err(_) => Message::Failed,
        };
        // Pass the end on, unless the link is "down" (then only once it is
        // back up) or the connection was cut meanwhile.
        if shared.wait_out_blackhole(id) {
            match end {
                Message::Eof => {
                    let _ = to.shutdown(Shutdown::Write);
                }
                _ => abort(registration),
            }
        }
        return;
    }
}

/// Closes both sockets of the connection at once.
fn abort(registration: &Registration) {
    if let Some(conn) = registration.shared.lock().conns.remove(&registration.id) {
        conn.shutdown();
    }
    registration.shared.changed.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes every byte back, on its own thread.
    fn echo_server() -> io::Result<SocketAddr> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(addr)
    }

    fn echo(stream: &mut TcpStream, text: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(text)?;
        let mut buf = vec![0u8; text.len()];
        stream.read_exact(&mut buf)?;
        Ok(buf)
    }

    #[test]
    fn forwards_and_reports_state() -> Result<(), Box<dyn std::error::Error>> {
        let upstream = echo_server()?;
        let proxy = FaultProxy::start(upstream)?;
        assert_eq!(proxy.upstream(), upstream);
        assert_eq!(proxy.addr().port(), proxy.port());
        assert!(proxy.addr().ip().is_loopback());
        assert_eq!(proxy.faults(), Faults::default());

        let mut client = TcpStream::connect(proxy.addr())?;
        assert_eq!(
            echo(&mut client, b"hello", Duration::from_secs(5))?,
            b"hello"
        );
        assert_eq!(proxy.connections(), 1);

        proxy.set_latency(Direction::Downstream, Duration::from_millis(7));
        proxy.blackhole(true);
        proxy.refuse(true);
        let faults = proxy.faults();
        assert_eq!(faults.latency_upstream, Duration::ZERO);
        assert_eq!(faults.latency_downstream, Duration::from_millis(7));
        assert!(faults.blackhole && faults.refuse);
        proxy.heal();
        assert_eq!(proxy.faults(), Faults::default());

        // A half-close is passed on and the connection then goes away.
        client.shutdown(Shutdown::Write)?;
        let mut rest = Vec::new();
        client.read_to_end(&mut rest)?;
        assert!(rest.is_empty());
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.connections() > 0 && Instant::now() < deadline {
            thread::sleep(POLL_INTERVAL);
        }
        assert_eq!(proxy.connections(), 0);
        Ok(())
    }

    /// The faults say what is frozen, and what was sent while frozen
    /// arrives whole and in order once thawed (that the server's writes
    /// then block is shown by leasehold-pg's tests, where a backend is
    /// seen waiting in `ClientWrite`).
    #[test]
    fn a_frozen_direction_reads_nothing_until_thawed() -> Result<(), Box<dyn std::error::Error>> {
        let upstream = echo_server()?;
        let proxy = FaultProxy::start(upstream)?;
        let mut client = TcpStream::connect(proxy.addr())?;
        assert_eq!(echo(&mut client, b"warm", Duration::from_secs(5))?, b"warm");
        for direction in [Direction::Downstream, Direction::Both] {
            proxy.freeze(direction, true);
            let faults = proxy.faults();
            assert!(faults.frozen_downstream);
            assert_eq!(faults.frozen_upstream, direction == Direction::Both);
            client.write_all(b"held back")?;
            proxy.freeze(direction, false);
            assert_eq!(proxy.faults(), Faults::default());
            let mut buf = [0u8; 9];
            client.set_read_timeout(Some(Duration::from_secs(5)))?;
            client.read_exact(&mut buf)?;
            assert_eq!(&buf, b"held back");
        }
        Ok(())
    }

    #[test]
    fn counts_round_trips_and_pipelined_requests_once() -> Result<(), Box<dyn std::error::Error>> {
        let proxy = FaultProxy::start(echo_server()?)?;
        let mut client = TcpStream::connect(proxy.addr())?;
        for _ in 0..3 {
            assert_eq!(echo(&mut client, b"ping", Duration::from_secs(5))?, b"ping");
        }
        assert_eq!(proxy.round_trips(), 3);
        // Two requests written before the first answer is delivered: one
        // round trip.
        proxy.set_latency(Direction::Downstream, Duration::from_millis(50));
        client.write_all(b"a")?;
        client.write_all(b"b")?;
        let mut buf = [0u8; 2];
        client.set_read_timeout(Some(Duration::from_secs(5)))?;
        client.read_exact(&mut buf)?;
        assert_eq!(&buf, b"ab");
        assert_eq!(proxy.round_trips(), 4);
        Ok(())
    }

    #[test]
    fn blackhole_holds_back_a_close_until_healed() -> Result<(), Box<dyn std::error::Error>> {
        let proxy = FaultProxy::start(echo_server()?)?;
        let mut client = TcpStream::connect(proxy.addr())?;
        assert_eq!(echo(&mut client, b"x", Duration::from_secs(5))?, b"x");
        proxy.blackhole(true);
        client.shutdown(Shutdown::Write)?;
        client.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = [0u8; 1];
        let err = client
            .read(&mut buf)
            .expect_err("the close must be held back");
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{err:?}"
        );
        assert_eq!(proxy.connections(), 1);
        proxy.blackhole(false);
        client.set_read_timeout(Some(Duration::from_secs(5)))?;
        assert_eq!(client.read(&mut buf)?, 0);
        Ok(())
    }

    #[test]
    fn unreachable_upstream_closes_the_client() -> Result<(), Box<dyn std::error::Error>> {
        // Bound and dropped: nothing listens there any more.
        let upstream = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?;
        let proxy = FaultProxy::start(upstream)?;
        let mut client = TcpStream::connect(proxy.addr())?;
        client.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = [0u8; 1];
        // End of file, or a reset; not a read timeout.
        match client.read(&mut buf) {
            Ok(n) => assert_eq!(n, 0),
            Err(err) => assert!(
                !matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ),
                "{err:?}"
            ),
        }
        Ok(())
    }
}
