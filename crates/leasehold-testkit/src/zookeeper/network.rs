//! The network between the members of a
//! [`ZooKeeperEnsemble`](super::ZooKeeperEnsemble) and from clients to
//! them: a [`FaultProxy`] on every path, so that a member can be cut off.
//!
//! # Why names, and one hosts file per member
//!
//! A member reaches another on two ports: the quorum port (a follower
//! dials its leader's) and the election port (leader election, one
//! connection per pair). Putting a proxy at the address each member's
//! configuration gives for the others is not enough: the election
//! protocol keeps one connection per pair, opened by the member with the
//! higher id, and when the lower one dials first the higher one hangs up
//! and calls it back at the address the lower one announced in its first
//! message (ZooKeeper 3.8's `QuorumCnxManager.handleConnection`: its own
//! election address, from its own `server.N` line). With addresses in
//! the configuration that call-back goes straight to the member's own
//! port, past any proxy, and the connection it opens outlives a cut.
//!
//! So the configuration, identical on every member, names the servers
//! (`server.2=zk-2:QUORUM:ELECTION`), and each JVM resolves the names
//! with a hosts file of its own (`-Djdk.net.hosts.file`, which OpenJDK
//! reads instead of the system's resolver): its own name is `127.0.0.1`,
//! where it listens; member `a`'s name for member `b` is `127.0.a.b`
//! (server ids, from 1), where a proxy listens on `b`'s very ports and
//! forwards to `b`. On Linux every `127.x.y.z` address is the loopback
//! interface, so no privilege is needed. A call-back then resolves the
//! announced name in the caller's hosts file and goes through the proxy
//! of that pair too: every connection between two members, in either
//! direction and on either port, passes one of the pair's proxies.
//!
//! Clients reach member `i` through a proxy of its own as well
//! ([`proxied_connect_string`](super::ZooKeeperEnsemble::proxied_connect_string)),
//! so that a member cut off is cut off from them too; the four-letter
//! words the kit sends go to the member's own client port.
//!
//! # What a cut-off is
//!
//! A member cut off has every connection to and from it closed, on every
//! one of its proxies (to and from each peer, and from clients), and
//! every new one closed as soon as it is accepted, until it is healed: as
//! behind a firewall that answers with resets, rather than one that drops
//! packets (which ZooKeeper would notice later, after its timeouts). A
//! link between two members is open only while neither is cut off, so
//! two members cut off cannot reach each other either.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::member::ZooKeeperMember;
use crate::Error;
use crate::proxy::FaultProxy;

/// The proxies of one ordered pair of members: what `from` dials to reach
/// `to`'s quorum and election ports.
#[derive(Debug)]
struct Link {
    from: usize,
    to: usize,
    proxies: [FaultProxy; 2],
}

/// Every proxy of an ensemble, and which members are cut off.
#[derive(Debug)]
pub(super) struct Network {
    links: Vec<Link>,
    clients: Vec<FaultProxy>,
    cut_off: Mutex<BTreeSet<usize>>,
}

/// The address member `from` (an index) dials for member `to`:
/// `127.0.FROM.TO` in server ids.
fn link_ip(from: usize, to: usize) -> Result<Ipv4Addr, Error> {
    let id = |index: usize| {
        u8::try_from(index + 1).map_err(|_| Error::ZooKeeperEnsembleSize { members: index + 1 })
    };
    Ok(Ipv4Addr::new(127, 0, id(from)?, id(to)?))
}

/// The name of member `index` in the configuration: `zk-ID`.
pub(super) fn host_name(index: usize) -> String {
    format!("zk-{}", index + 1)
}

impl Network {
    /// Starts the proxies between `members` and in front of their client
    /// ports.
    ///
    /// # Errors
    ///
    /// [`Error::FreePort`] if a proxy cannot listen (a member's port is
    /// taken on `127.0.a.b`), [`Error::ProxyThread`],
    /// [`Error::ZooKeeperEnsembleSize`] beyond 255 members.
    pub(super) fn start(members: &[ZooKeeperMember]) -> Result<Self, Error> {
        let mut links = Vec::new();
        for from in members {
            for to in members.iter().filter(|to| to.index() != from.index()) {
                let ip = link_ip(from.index(), to.index())?;
                let proxy = |upstream: SocketAddr| {
                    FaultProxy::start_at(SocketAddr::from((ip, upstream.port())), upstream)
                };
                links.push(Link {
                    from: from.index(),
                    to: to.index(),
                    proxies: [proxy(to.quorum_addr())?, proxy(to.election_addr())?],
                });
            }
        }
        let clients = members
            .iter()
            .map(|member| FaultProxy::start(member.client_addr()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            links,
            clients,
            cut_off: Mutex::new(BTreeSet::new()),
        })
    }

    /// The hosts file of member `index`: its own name at `127.0.0.1`, the
    /// others' at its proxies for them.
    pub(super) fn hosts_file(&self, index: usize, members: usize) -> Result<String, Error> {
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for other in 0..members {
            let ip = match other == index {
                true => Ipv4Addr::LOCALHOST,
                false => link_ip(index, other)?,
            };
            hosts.push_str(&format!("{ip} {}\n", host_name(other)));
        }
        Ok(hosts)
    }

    /// The proxy in front of member `index`'s client port.
    pub(super) fn client_proxy(&self, index: usize) -> &FaultProxy {
        &self.clients[index]
    }

    fn cut_off(&self) -> MutexGuard<'_, BTreeSet<usize>> {
        self.cut_off.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cuts member `index` off (`true`) or heals it (`false`), and sets
    /// every proxy that touches it accordingly.
    pub(super) fn set_cut_off(&self, index: usize, on: bool) {
        let mut cut_off = self.cut_off();
        match on {
            true => cut_off.insert(index),
            false => cut_off.remove(&index),
        };
        let touching = self
            .links
            .iter()
            .filter(|link| link.from == index || link.to == index)
            .map(|link| {
                let open = !cut_off.contains(&link.from) && !cut_off.contains(&link.to);
                (&link.proxies[..], open)
            })
            .chain(std::iter::once((
                std::slice::from_ref(&self.clients[index]),
                !on,
            )));
        for (proxies, open) in touching {
            for proxy in proxies {
                proxy.refuse(!open);
                if !open {
                    proxy.cut();
                }
            }
        }
    }

    /// Whether member `index` is cut off.
    pub(super) fn is_cut_off(&self, index: usize) -> bool {
        self.cut_off().contains(&index)
    }
}
