//! The harness's callers: each on its own OS thread with its own
//! single-threaded tokio runtime, like a process of its own.
//!
//! # Why a thread and a runtime per caller
//!
//! A real holder pause (a GC pause, a swapped-out or SIGSTOPped process)
//! stops *everything* the holder runs, its watchdog included: nothing
//! refreshes the lease, the lease expires, another caller takes the lock
//! and writes, and when the holder wakes it goes on with its write as if
//! nothing happened. A `tokio::time::sleep` at the pause point stops only
//! the caller's task: its watchdog, another task, goes on refreshing the
//! lease, so the "pause" is harmless and a broken write path passes.
//!
//! So each caller runs on its own thread and runtime, where it takes its
//! leases (a lease's watchdog runs on the runtime the lease was taken on),
//! and the harness's pause point blocks that thread
//! ([`Stall::freezing`]): the caller, its watchdog and any task it spawned
//! stop together, for real, and resume together. Callers that are not
//! paused run on. Other choices were weighed: a SIGSTOP needs the callers
//! in a child process, which a closure over your in-memory state or
//! connection pool cannot follow; a gate inside the watchdog would need a
//! test hook in the library.
//!
//! What it does not freeze: tasks of *your* runtime (a database
//! connection's driver task, the lock's Redis connection, opened on your
//! runtime), which a real paused process would have frozen too. They stay
//! responsive, which matters only if a paused holder's request is in
//! flight at the pause point. After the Redis connection is re-opened
//! (a restart or network fault), its driver may live on a caller's
//! runtime; a pause of that caller then also delays the others' requests.

use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;

use leasehold::CancellationToken;
use tokio::sync::watch;

use crate::callers::{Call, Callers, Lock, Stall, Written};
use crate::outcome::{Outcome, Writes};
use crate::recorder::Recorder;

/// What one caller thread runs with: the callers' settings (worker 0's,
/// [`Harness::callers_of`](crate::Harness::callers_of)), the lock, the
/// run's stop and the pause point's stall.
struct Context {
    settings: Callers,
    lock: Lock,
    stop: CancellationToken,
    stall: Stall,
}

/// One caller's place in a run, as its body sees it once the run starts:
/// the callers' settings, the lock, the run's stop, the pause point's
/// stall, its number and the run's recorder.
pub(crate) struct Seat<'a> {
    pub(crate) settings: &'a Callers,
    pub(crate) lock: &'a Lock,
    pub(crate) stop: &'a CancellationToken,
    pub(crate) stall: &'a Stall,
    pub(crate) task: u32,
    pub(crate) recorder: &'a Recorder,
}

/// Why a caller thread could not run.
#[derive(Debug)]
pub(crate) enum CallerFailure {
    /// Its runtime could not be built.
    Runtime(std::io::Error),
    /// The write path (or the lock) panicked.
    Panicked,
}

/// Caller threads started by [`start`]: each has run (or is running) its
/// setup, and waits for [`go`](Started::go) before it takes a lock.
pub(crate) struct Started {
    handles: Vec<std::io::Result<JoinHandle<std::io::Result<()>>>>,
    writes: Arc<Mutex<Writes>>,
    ready: mpsc::Receiver<bool>,
    go: watch::Sender<Option<Recorder>>,
}

/// Says once whether a caller's setup finished: `true` by
/// [`done`](Ready::done), `false` if the caller fails first (its runtime
/// could not start, its setup panicked), so the coordinator never waits for
/// a caller that will not come.
struct Ready(Option<mpsc::Sender<bool>>);

impl Ready {
    fn done(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(true);
        }
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(false);
        }
    }
}

/// Starts `settings.tasks` caller threads. Each builds its runtime, runs `setup`
/// (its state of its own, e.g. a database connection, opened on its own
/// runtime), then waits for [`Started::go`]; from then until `stop` it
/// runs `body` with its [`Seat`] and that state: the caller loop around a
/// write path ([`writer`]) or a candidate's leader loop
/// ([`leaders`](crate::leaders)).
pub(crate) fn start<S, F, B>(
    settings: &Callers,
    lock: &Lock,
    stop: &CancellationToken,
    stall: &Stall,
    setup: Arc<F>,
    body: Arc<B>,
) -> Started
where
    S: 'static,
    F: AsyncFn(u32) -> S + Send + Sync + 'static,
    B: AsyncFn(Seat<'_>, &mut S) -> Writes + Send + Sync + 'static,
{
    let writes = Arc::new(Mutex::new(Writes::default()));
    let (ready_tx, ready) = mpsc::channel();
    let (go, go_rx) = watch::channel(None::<Recorder>);
    let handles = (0..settings.tasks)
        .map(|task| {
            let context = Context {
                settings: settings.clone(),
                lock: lock.clone(),
                stop: stop.clone(),
                stall: stall.clone(),
            };
            let (stop, setup, body, writes) =
                (stop.clone(), setup.clone(), body.clone(), writes.clone());
            let (ready, mut go) = (Ready(Some(ready_tx.clone())), go_rx.clone());
            std::thread::Builder::new()
                .name(format!("caller-{task}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let mine = runtime.block_on(async {
                        let mut state = setup(task).await;
                        ready.done();
                        let recorder = tokio::select! {
                            biased;
                            () = stop.cancelled() => None,
                            recorder = go.wait_for(Option::is_some) => {
                                recorder.ok().and_then(|r| r.clone())
                            }
                        };
                        match recorder {
                            Some(recorder) => {
                                let seat = Seat {
                                    settings: &context.settings,
                                    lock: &context.lock,
                                    stop: &context.stop,
                                    stall: &context.stall,
                                    task,
                                    recorder: &recorder,
                                };
                                body(seat, &mut state).await
                            }
                            None => Writes::default(),
                        }
                    });
                    writes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .merge(mine);
                    Ok::<(), std::io::Error>(())
                })
        })
        .collect();
    Started {
        handles,
        writes,
        ready,
        go,
    }
}

impl Started {
    /// Waits until every caller thread has run its setup: `false` if one
    /// failed first (it could not start, or its setup panicked).
    pub(crate) async fn ready(&mut self) -> bool {
        let expected = self.handles.iter().filter(|h| h.is_ok()).count();
        let ready = std::mem::replace(&mut self.ready, mpsc::channel().1);
        let all =
            tokio::task::spawn_blocking(move || (0..expected).all(|_| ready.recv() == Ok(true)))
                .await;
        all.unwrap_or(false) && expected == self.handles.len()
    }

    /// Lets the callers take locks, recording into `recorder`.
    pub(crate) fn go(&self, recorder: &Recorder) {
        self.go.send_replace(Some(recorder.clone()));
    }

    /// Joins the callers on a blocking thread: what they wrote.
    pub(crate) async fn join(self) -> Result<Writes, CallerFailure> {
        let handles = self.handles;
        let joined = tokio::task::spawn_blocking(move || {
            let mut failure = None;
            for handle in handles {
                let outcome = match handle {
                    Err(err) => Err(CallerFailure::Runtime(err)),
                    Ok(handle) => match handle.join() {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(err)) => Err(CallerFailure::Runtime(err)),
                        Err(_) => Err(CallerFailure::Panicked),
                    },
                };
                if let Err(err) = outcome {
                    failure.get_or_insert(err);
                }
            }
            failure
        })
        .await
        .unwrap_or(Some(CallerFailure::Panicked));
        if let Some(failure) = joined {
            return Err(failure);
        }
        let writes = self
            .writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(writes)
    }
}

/// The body of a caller around a write path: [`Callers::caller`] (the
/// loop the worker processes run too, recording every caller error) with
/// `write` given the caller's state; what it wrote is tallied. The write
/// is never cut short by the harness (the write path decides, see
/// [`Call::run`]).
pub(crate) fn writer<S, W>(
    write: Arc<W>,
) -> impl AsyncFn(Seat<'_>, &mut S) -> Writes + Send + Sync + 'static
where
    S: 'static,
    W: AsyncFn(&mut S, Call<'_>) -> Outcome + Send + Sync + 'static,
{
    async move |seat: Seat<'_>, state: &mut S| {
        let mut writes = Writes::default();
        let tallied = async |call: Call<'_>| {
            let (resource, amount) = (call.resource.to_owned(), call.amount);
            let outcome = write(state, call).await;
            writes.add(&resource, amount, &outcome);
            Written::from(outcome)
        };
        seat.settings
            .caller(
                seat.task,
                seat.lock,
                seat.recorder,
                seat.stop,
                seat.stall,
                tallied,
            )
            .await;
        writes
    }
}
