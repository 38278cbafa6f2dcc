//! Double holders, counted and not judged (the module docs' "Double
//! holders are counted, not judged"): each lease's holding interval, and
//! the intervals of two tokens on one key that intersect.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{Event, Kind};

/// One of two holders of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Holder {
    /// The caller.
    pub actor: String,
    /// Its lease's token label.
    pub token: String,
}

/// Two leases on one key held at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Overlap {
    /// The lock key.
    pub key: String,
    /// The holder that acquired first (or, at the same instant, appears
    /// first in the history).
    pub a: Holder,
    /// The other holder.
    pub b: Holder,
    /// When both held it, from (inclusive).
    pub from_us: u64,
    /// To (exclusive).
    pub to_us: u64,
}

/// How a lease's holding interval ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEnd {
    /// The holder released it (whatever the release's outcome).
    Released,
    /// The holder learnt it was lost.
    Lost {
        /// Why, as recorded.
        cause: String,
    },
    /// Neither: held until the end of the history.
    Open,
}

/// One lease, held in its holder's view from `from_us` to `to_us`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseSpan {
    /// The holder.
    pub actor: String,
    /// The lock key.
    pub key: String,
    /// The token label.
    pub token: String,
    /// The fencing token, if any.
    pub fence: Option<u64>,
    /// When it was acquired.
    pub from_us: u64,
    /// When it was released or lost, or the end of the history.
    pub to_us: u64,
    /// How it ended.
    pub end: LeaseEnd,
}

pub(super) fn lease_spans_sorted(events: &[&Event]) -> Vec<LeaseSpan> {
    let end_of_history = events.last().map_or(0, |e| e.at_us);
    let mut spans: Vec<LeaseSpan> = Vec::new();
    let mut open: HashMap<(&str, &str), usize> = HashMap::new();
    for event in events {
        let (key, token, end) = match &event.kind {
            Kind::Acquired {
                key, token, fence, ..
            } => {
                open.insert((key, token), spans.len());
                spans.push(LeaseSpan {
                    actor: event.actor.clone(),
                    key: key.clone(),
                    token: token.clone(),
                    fence: *fence,
                    from_us: event.at_us,
                    to_us: end_of_history,
                    end: LeaseEnd::Open,
                });
                continue;
            }
            Kind::Released { key, token, .. } => (key, token, LeaseEnd::Released),
            Kind::Lost { key, token, cause } => (
                key,
                token,
                LeaseEnd::Lost {
                    cause: cause.clone(),
                },
            ),
            _ => continue,
        };
        if let Some(index) = open.remove(&(key.as_str(), token.as_str()))
            && let Some(span) = spans.get_mut(index)
        {
            span.to_us = event.at_us.max(span.from_us);
            span.end = end;
        }
    }
    spans
}

pub(super) fn overlaps(spans: &[LeaseSpan]) -> Vec<Overlap> {
    let mut by_key: BTreeMap<&str, Vec<&LeaseSpan>> = BTreeMap::new();
    for span in spans {
        by_key.entry(&span.key).or_default().push(span);
    }
    let mut found = Vec::new();
    for (key, spans) in by_key {
        // `spans` is in acquisition order: once a later lease starts after
        // this one ends, no later one can intersect it.
        for (i, a) in spans.iter().enumerate() {
            for b in spans.iter().skip(i + 1) {
                if b.from_us >= a.to_us {
                    break;
                }
                let (from_us, to_us) = (b.from_us, a.to_us.min(b.to_us));
                if a.token == b.token || from_us >= to_us {
                    continue;
                }
                found.push(Overlap {
                    key: key.to_owned(),
                    a: Holder {
                        actor: a.actor.clone(),
                        token: a.token.clone(),
                    },
                    b: Holder {
                        actor: b.actor.clone(),
                        token: b.token.clone(),
                    },
                    from_us,
                    to_us,
                });
            }
        }
    }
    found.sort_by_key(|o| (o.from_us, o.to_us));
    found
}
