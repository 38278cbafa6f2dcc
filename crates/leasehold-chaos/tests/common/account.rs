//! One in-memory account as a user's write path for the harness: a
//! balance, the highest fence that wrote it, and a ledger of debits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_chaos::{Call, Kind, Outcome};

/// A balance, the highest fence that wrote it, a ledger.
#[derive(Default)]
pub struct Account {
    pub balance: i64,
    pub fence: u64,
    pub ledger: Vec<i64>,
}

/// A fresh account holding 1,000,000.
pub fn account() -> Arc<Mutex<Account>> {
    Arc::new(Mutex::new(Account {
        balance: 1_000_000,
        ..Account::default()
    }))
}

/// The write path: a debit of `account` under `Call::run` (the watchdog,
/// when the harness runs one), a `read` long read, then the pause point,
/// then the write. `checked`: a check-and-set on the fence and the value
/// read; otherwise blind.
pub fn account_path(
    account: Arc<Mutex<Account>>,
    checked: bool,
    read: Duration,
) -> impl AsyncFn(Call<'_>) -> Outcome + Send + Sync + 'static {
    async move |call: Call<'_>| {
        let work = async {
            let (balance, seen) = {
                let a = account.lock().expect("account");
                (a.balance, a.fence)
            };
            tokio::time::sleep(read).await;
            call.pause_point().await;
            let token = call.fence().map_or(0, |f| f.get());
            let mut a = account.lock().expect("account");
            if checked && (a.fence != seen || token <= a.fence || a.balance != balance) {
                return Outcome::Refused;
            }
            a.balance = balance - call.amount;
            a.fence = a.fence.max(token);
            a.ledger.push(call.amount);
            Outcome::Committed
        };
        match call.run(work).await {
            Ok(outcome) => outcome,
            Err(stopped) => stopped.into(),
        }
    }
}

/// The account's final state, for the harness's check (`account:1`).
pub fn final_state(account: &Mutex<Account>) -> Vec<Kind> {
    let a = account.lock().expect("account");
    vec![Kind::Final {
        resource: "account:1".to_owned(),
        balance: a.balance,
        ledger_sum: a.ledger.iter().sum(),
        ledger_rows: a.ledger.len() as u64,
    }]
}
