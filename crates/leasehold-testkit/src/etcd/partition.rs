//! Cutting etcd members off: a gate (a small TCP proxy) in front of every
//! member's peer port and client port, and one shared table of who is cut.
//!
//! Members talk raft over HTTP on their peer URLs, and each one *dials*
//! the others: every member keeps two stream connections (`GET
//! /raft/stream/...`) open to each peer and `POST`s pipeline messages,
//! snapshots and forwarded lease renewals (`/leases`) on connections of its
//! own. Refusing only what comes *in* to a member therefore leaves what it
//! sends out: a "cut" leader would still reach its followers. So the
//! members advertise their gates' ports as their peer URLs, and every
//! gate asks who dialled before it forwards: the connecting socket's
//! inode is looked up in `/proc/net/tcp` and found among the members'
//! file descriptors (`/proc/PID/fd`). A connection is refused (closed at
//! once) when its target or its dialler is cut off, and cutting a member
//! closes every open connection it has through the gates. That covers
//! every request a member makes, with or without rafthttp's
//! `X-Server-From` header, and needs no HTTP parsing. Linux only, as the
//! rest of the crate.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use crate::Error;

/// How long a gate waits to connect to its member.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Which of a member's ports a gate stands in front of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// Raft traffic from the other members.
    Peer,
    /// Requests from clients.
    Client,
}

/// How a member is cut off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cut {
    peers: bool,
    clients: bool,
}

/// Who is cut off, the members' process ids (to tell who dialled), and the
/// connections open through the gates.
#[derive(Debug)]
pub(super) struct Partition {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    cut: Vec<Cut>,
    pids: Vec<Option<u32>>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
}

/// A connection through a gate: who dialled whom, and its two sockets.
#[derive(Debug)]
struct Conn {
    from: Option<usize>,
    to: usize,
    side: Side,
    sockets: [TcpStream; 2],
}

impl Conn {
    fn close(&self) {
        for socket in &self.sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

impl State {
    /// Whether a connection from `from` (a member, or someone else) to
    /// member `to`'s `side` may pass.
    fn allows(&self, from: Option<usize>, to: usize, side: Side) -> bool {
        match side {
            Side::Client => !self.cut[to].clients,
            Side::Peer => !self.cut[to].peers && from.is_none_or(|from| !self.cut[from].peers),
        }
    }
}

impl Partition {
    /// A partition of `members` members, none of them cut off.
    pub(super) fn new(members: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                cut: vec![Cut::default(); members],
                pids: vec![None; members],
                conns: HashMap::new(),
                next_id: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records member `member`'s process id (`None` while it is stopped).
    pub(super) fn set_pid(&self, member: usize, pid: Option<u32>) {
        self.lock().pids[member] = pid;
    }

    /// Cuts member `member` off from its peers, and from its clients too if
    /// `clients`, closing the connections that no longer may pass.
    pub(super) fn cut(&self, member: usize, clients: bool) {
        let mut state = self.lock();
        state.cut[member] = Cut {
            peers: true,
            clients,
        };
        let state = &mut *state;
        state.conns.retain(|_, conn| {
            let keep = match conn.side {
                Side::Client => !(clients && conn.to == member),
                Side::Peer => conn.to != member && conn.from != Some(member),
            };
            if !keep {
                conn.close();
            }
            keep
        });
    }

    /// Lets member `member`'s connections pass again.
    pub(super) fn heal(&self, member: usize) {
        self.lock().cut[member] = Cut::default();
    }

    /// Whether member `member` is cut off from its peers.
    pub(super) fn is_cut(&self, member: usize) -> bool {
        self.lock().cut[member].peers
    }

    /// Closes every connection through the gates.
    pub(super) fn close_all(&self) {
        for (_, conn) in self.lock().conns.drain() {
            conn.close();
        }
    }

    /// Which member owns the socket that dialled `gate` from `dialler`.
    fn dialler(&self, dialler: SocketAddr, gate: SocketAddr) -> Option<usize> {
        let inode = socket_inode(dialler.port(), gate.port())?;
        let link = format!("socket:[{inode}]");
        let pids = self.lock().pids.clone();
        pids.iter().position(|pid| {
            pid.is_some_and(|pid| {
                std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                    fds.flatten().any(|fd| {
                        std::fs::read_link(fd.path())
                            .is_ok_and(|target| target.as_os_str() == link.as_str())
                    })
                })
            })
        })
    }
}

/// The inode of the IPv4 TCP socket whose local port is `local` and remote
/// port is `remote`, from `/proc/net/tcp`.
fn socket_inode(local: u16, remote: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local_addr, remote_addr, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        // A closed socket (TIME_WAIT) with the same ports has inode 0; on
        // loopback Linux may reuse its ports for a new connection.
        let inode = inode.parse().ok().filter(|&inode| inode != 0)?;
        (port(local_addr)? == local && port(remote_addr)? == remote).then_some(inode)
    })
}

/// A gate in front of one port of one member: accepts on a loopback port
/// of its own and forwards what the [`Partition`] lets pass.
#[derive(Debug)]
pub(super) struct Gate {
    addr: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl Gate {
    /// Starts a gate forwarding to `upstream`, member `member`'s `side`.
    pub(super) fn start(
        partition: &Arc<Partition>,
        member: usize,
        side: Side,
        upstream: SocketAddr,
    ) -> Result<Self, Error> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Error::FreePort)?;
        let addr = listener.local_addr().map_err(Error::FreePort)?;
        let stopped = Arc::new(AtomicBool::new(false));
        let partition = Arc::clone(partition);
        let stop = Arc::clone(&stopped);
        thread::Builder::new()
            .name(format!("etcd-gate-{member}-{side:?}"))
            .spawn(move || {
                for accepted in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = accepted else {
                        thread::sleep(crate::process::POLL_INTERVAL);
                        continue;
                    };
                    let partition = Arc::clone(&partition);
                    let _ = thread::Builder::new()
                        .name(format!("etcd-gate-{member}-conn"))
                        .spawn(move || serve(&partition, client, addr, member, side, upstream));
                }
            })
            .map_err(Error::ProxyThread)?;
        Ok(Self { addr, stopped })
    }

    /// The gate's address, which the member advertises.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wake the accepting thread so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Forwards one accepted connection if it may pass, until either side
/// closes it or a cut does.
fn serve(
    partition: &Partition,
    client: TcpStream,
    gate: SocketAddr,
    to: usize,
    side: Side,
    upstream: SocketAddr,
) {
    let from = match (side, client.peer_addr()) {
        (Side::Peer, Ok(dialler)) => partition.dialler(dialler, gate),
        _ => None,
    };
    if !partition.lock().allows(from, to, side) {
        return; // dropping `client` closes it
    }
    let Ok(server) = TcpStream::connect_timeout(&upstream, CONNECT_TIMEOUT) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let Ok(clones) = clone_pair(&client, &server) else {
        return;
    };
    let id = {
        let mut state = partition.lock();
        // A cut may have come while connecting.
        if !state.allows(from, to, side) {
            return;
        }
        let id = state.next_id;
        state.next_id += 1;
        state.conns.insert(
            id,
            Conn {
                from,
                to,
                side,
                sockets: clones,
            },
        );
        id
    };
    let (Ok(client_in), Ok(server_in)) = (client.try_clone(), server.try_clone()) else {
        if let Some(conn) = partition.lock().conns.remove(&id) {
            conn.close();
        }
        return;
    };
    let upstream_copy = thread::Builder::new()
        .name(format!("etcd-gate-{to}-copy"))
        .spawn(move || copy(client_in, server));
    copy(server_in, client);
    if let Ok(handle) = upstream_copy {
        let _ = handle.join();
    }
    if let Some(conn) = partition.lock().conns.remove(&id) {
        conn.close();
    }
}

fn clone_pair(client: &TcpStream, server: &TcpStream) -> io::Result<[TcpStream; 2]> {
    Ok([client.try_clone()?, server.try_clone()?])
}

/// Copies `from` into `to` until `from` ends, then closes both: a member
/// that goes away takes the whole connection with it.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
