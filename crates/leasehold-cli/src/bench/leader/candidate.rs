//! A candidate process of `bench leader`, re-invoked by the bench as
//! `leasehold bench leader-candidate`, so that a stopped leader is a real
//! stopped process (SIGSTOP). It reads its spec as one JSON line on stdin,
//! connects, and campaigns in a loop on the spec's election, printing each
//! [`Event`] as one line on stdout, with timestamps in microseconds since
//! the Unix epoch from the wall clock (which every process on the machine
//! reads alike).
//!
//! It takes two commands on stdin: `resign <fence>` resigns the term with
//! that fencing token (a stale one, for a term already over, is ignored),
//! and `campaign`, which a resigned candidate waits for before it
//! campaigns again: a polling candidate that campaigned at once would often
//! win its own lock back before a follower's next poll, and the bench
//! measures the hand-over to another process. It exits when stdin closes.
//!
//! An error a library call returns to it (a campaign's, or a resign's
//! other than `NotHeld` or `LeaseLost`, which say the term was lost) is
//! printed as an [`Event::Error`] and the candidate goes on: it campaigns
//! again, as a service would. The bench counts them.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use leasehold::{Election, HandoffLocker, Lessor, Locker, Quorum};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use crate::cli::LeaderWay;

/// What a candidate runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) way: LeaderWay,
    /// The one server's URL, or the quorum's servers'.
    pub(crate) urls: Vec<String>,
    pub(crate) election: String,
    pub(crate) candidate: String,
    pub(crate) ttl_ms: u64,
}

/// One line a candidate prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Connected; campaigning from now on.
    Ready,
    /// `Election::campaign` returned a term with this fencing token.
    Elected { fence: u64, at_us: u64 },
    /// Read just before `Term::resign` was called and once it returned.
    Resigned { before_us: u64, after_us: u64 },
    /// The term was lost (`Term::lost`, or a resign that found it gone).
    Lost { at_us: u64, cause: String },
    /// A library call returned an error to the candidate: `call: error`.
    Error { at_us: u64, text: String },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Ready => write!(f, "ready"),
            Event::Elected { fence, at_us } => write!(f, "elected {fence} {at_us}"),
            Event::Resigned {
                before_us,
                after_us,
            } => write!(f, "resigned {before_us} {after_us}"),
            Event::Lost { at_us, cause } => write!(f, "lost {at_us} {cause}"),
            // One line: an error's chain may span several.
            Event::Error { at_us, text } => write!(f, "error {at_us} {}", text.replace('\n', " ")),
        }
    }
}

impl Event {
    /// The event a line shows, if it is one.
    pub(crate) fn parse(line: &str) -> Option<Event> {
        let mut words = line.trim_end().splitn(3, ' ');
        let number = |word: Option<&str>| word.and_then(|w| w.parse::<u64>().ok());
        let event = match words.next()? {
            "ready" => Event::Ready,
            "elected" => Event::Elected {
                fence: number(words.next())?,
                at_us: number(words.next())?,
            },
            "resigned" => Event::Resigned {
                before_us: number(words.next())?,
                after_us: number(words.next())?,
            },
            "lost" => Event::Lost {
                at_us: number(words.next())?,
                cause: words.next().unwrap_or_default().to_owned(),
            },
            "error" => Event::Error {
                at_us: number(words.next())?,
                text: words.next().unwrap_or_default().to_owned(),
            },
            _ => return None,
        };
        Some(event)
    }
}

/// Microseconds since the Unix epoch, now.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn say(event: &Event) {
    // A line each: stdout is line-buffered, so each reaches the bench as
    // it is printed.
    println!("{event}");
}

/// Runs the candidate described on stdin until stdin closes.
pub(crate) async fn run() -> anyhow::Result<()> {
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let input = stdin
        .next_line()
        .await
        .context("reading the candidate spec")?
        .context("no candidate spec on stdin")?;
    let spec: Spec = serde_json::from_str(&input).context("parsing the candidate spec")?;
    let clients = spec
        .urls
        .iter()
        .map(|url| redis::Client::open(url.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .context("a candidate's redis url")?;
    let first = clients.first().context("no redis url")?;
    match spec.way {
        LeaderWay::Poll => campaign(Locker::connect(first).await?, &spec, stdin).await,
        LeaderWay::Handoff => campaign(HandoffLocker::connect(first).await?, &spec, stdin).await,
        LeaderWay::Quorum => campaign(Quorum::connect(clients).await?, &spec, stdin).await,
    }
}

/// What ends a term of this candidate.
enum Next {
    Lost(String),
    Resign,
    Closed,
}

/// Campaigns, leads, resigns when told, and campaigns again when told.
async fn campaign<L: Lessor>(
    lessor: L,
    spec: &Spec,
    mut commands: Lines<BufReader<Stdin>>,
) -> anyhow::Result<()> {
    let election = Election::builder(lessor, spec.election.as_str())
        .candidate(spec.candidate.as_str())
        .ttl(Duration::from_millis(spec.ttl_ms))
        .build()?;
    say(&Event::Ready);
    loop {
        let term = {
            let campaign = election.campaign();
            tokio::pin!(campaign);
            loop {
                tokio::select! {
                    term = &mut campaign => break term,
                    // Commands for a term that is over: ignored.
                    line = commands.next_line() => if line?.is_none() {
                        return Ok(());
                    },
                }
            }
        };
        let term = match term {
            Ok(term) => term,
            Err(err) => {
                say(&Event::Error {
                    at_us: now_us(),
                    text: format!("campaign: {:#}", anyhow::Error::new(err)),
                });
                continue;
            }
        };
        let fence = term.fence().get();
        say(&Event::Elected {
            fence,
            at_us: now_us(),
        });
        let resign = format!("resign {fence}");
        let next = loop {
            tokio::select! {
                cause = term.lost() => break Next::Lost(cause.to_string()),
                line = commands.next_line() => match line? {
                    None => break Next::Closed,
                    Some(line) if line.trim() == resign => break Next::Resign,
                    Some(_) => {}
                },
            }
        };
        match next {
            Next::Closed => return Ok(()),
            Next::Lost(cause) => {
                say(&Event::Lost {
                    at_us: now_us(),
                    cause,
                });
                drop(term);
            }
            Next::Resign => {
                let before_us = now_us();
                let resigned = term.resign().await;
                let after_us = now_us();
                say(&match resigned {
                    Ok(()) => Event::Resigned {
                        before_us,
                        after_us,
                    },
                    Err(
                        err @ (leasehold::Error::NotHeld { .. }
                        | leasehold::Error::LeaseLost { .. }),
                    ) => Event::Lost {
                        at_us: after_us,
                        cause: format!("resign: {err}"),
                    },
                    Err(err) => Event::Error {
                        at_us: after_us,
                        text: format!("resign: {:#}", anyhow::Error::new(err)),
                    },
                });
                loop {
                    match commands.next_line().await? {
                        None => return Ok(()),
                        Some(line) if line.trim() == "campaign" => break,
                        Some(_) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back_as_printed() {
        for event in [
            Event::Ready,
            Event::Elected {
                fence: 7,
                at_us: 1_700_000_000_000_001,
            },
            Event::Resigned {
                before_us: 10,
                after_us: 12,
            },
            Event::Lost {
                at_us: 5,
                cause: "resign: lock not held".to_owned(),
            },
            Event::Error {
                at_us: 6,
                text: "campaign: redis: connection refused".to_owned(),
            },
        ] {
            assert_eq!(Event::parse(&event.to_string()), Some(event));
        }
        assert_eq!(Event::parse("elected x 1"), None);
        assert_eq!(Event::parse("hello"), None);
    }
}
