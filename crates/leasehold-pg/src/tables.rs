//! The names of the tables this crate reads and writes (a leaf module, so
//! the error type can name them without importing the modules that use
//! them).

/// The table of fences, one row per resource: `leasehold_fences (resource
/// text PRIMARY KEY, fence bigint, holder text)`: the highest fencing
/// token that has written the resource, and the holder that wrote it. The
/// one table the fence guard needs; created (or migrated) by
/// [`setup`](crate::setup).
pub const FENCES: &str = "leasehold_fences";

/// The tutorial's wallet table: `id bigint PRIMARY KEY`, `balance bigint
/// NOT NULL CHECK (balance >= 0)`, `fence bigint NOT NULL DEFAULT 0` (the
/// highest fencing token that has written, which doubles as the row's
/// version). Used only by the wallet helpers; created by
/// [`setup_wallets`](crate::setup_wallets).
pub const WALLETS: &str = "wallets";

/// The tutorial's ledger table: one row per accepted debit (`wallet_id`,
/// `amount`, `fence`: the token it was written with, NULL for
/// database-only writes), inserted in the same statement or transaction as
/// the debit. Created by [`setup_wallets`](crate::setup_wallets).
pub const LEDGER: &str = "wallet_ledger";
