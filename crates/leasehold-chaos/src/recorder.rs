//! Where callers and the nemesis append their events.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::history::{Event, Kind};

/// Appends [`Event`]s, timestamped against the run's start, to memory or to
/// a JSON-lines writer. Cheap to clone; clones share the sink.
///
/// Timestamps come from the system clock, so that worker processes on the
/// same machine, given the same start, agree with the coordinator.
#[derive(Clone)]
pub struct Recorder {
    start: SystemTime,
    sink: Arc<Mutex<Sink>>,
}

enum Sink {
    Memory(Vec<Event>),
    Lines(Box<dyn Write + Send>),
}

impl Recorder {
    /// A recorder that keeps events in memory ([`take`](Self::take)).
    pub fn in_memory(start: SystemTime) -> Recorder {
        Recorder {
            start,
            sink: Arc::new(Mutex::new(Sink::Memory(Vec::new()))),
        }
    }

    /// A recorder that writes each event as one JSON line to `out` (a
    /// worker's stdout, a file). A failed write is dropped: the checker
    /// reports the history incomplete (a missing completion), never wrong.
    pub fn to_writer(start: SystemTime, out: impl Write + Send + 'static) -> Recorder {
        Recorder {
            start,
            sink: Arc::new(Mutex::new(Sink::Lines(Box::new(out)))),
        }
    }

    /// The run's start.
    pub fn start(&self) -> SystemTime {
        self.start
    }

    /// Microseconds since the run's start (0 before it).
    pub fn now_us(&self) -> u64 {
        since(self.start)
    }

    /// Appends `kind` by `actor`, stamped now.
    pub fn record(&self, actor: &str, kind: Kind) {
        self.record_at(self.now_us(), actor, kind);
    }

    /// Appends `kind` by `actor`, stamped `at_us`.
    pub fn record_at(&self, at_us: u64, actor: &str, kind: Kind) {
        let event = Event {
            at_us,
            actor: actor.to_owned(),
            kind,
        };
        let mut sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *sink {
            Sink::Memory(events) => events.push(event),
            Sink::Lines(out) => {
                if let Ok(mut line) = serde_json::to_vec(&event) {
                    line.push(b'\n');
                    let _ = out.write_all(&line).and_then(|()| out.flush());
                }
            }
        }
    }

    /// Takes the events kept so far (none for a writer).
    pub fn take(&self) -> Vec<Event> {
        let mut sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *sink {
            Sink::Memory(events) => std::mem::take(events),
            Sink::Lines(_) => Vec::new(),
        }
    }
}

/// Microseconds from `start` to now (0 if now is before it).
pub(crate) fn since(start: SystemTime) -> u64 {
    SystemTime::now()
        .duration_since(start)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A run start as microseconds since the Unix epoch, to pass to a worker.
pub fn start_to_micros(start: SystemTime) -> u64 {
    start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The inverse of [`start_to_micros`].
pub fn start_from_micros(micros: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros)
}
