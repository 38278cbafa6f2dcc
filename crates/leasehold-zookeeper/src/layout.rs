//! Where a lock lives in ZooKeeper's tree, and how its contenders are
//! named and ordered: Apache Curator's layout, so that Curator's
//! `InterProcessMutex` (and any recipe that orders by the sequence suffix)
//! and leasehold queue for the same lock.
//!
//! - A lock key `k` is the directory `<root>/<escaped k>`: ASCII letters,
//!   digits and `-_.:{}@=+,` stay as they are, every other byte (`/`,
//!   `%`, spaces, non-ASCII) is `%XX`, so one key is one directory and a
//!   key never names another key's subtree; a key of dots alone is
//!   escaped whole (`.` and `..` are not valid node names).
//! - Each contender is one `EPHEMERAL_SEQUENTIAL` node in it, named
//!   `_c_<uuid>-lock-<sequence>` as Curator's protected creates name
//!   theirs. The `uuid` is the acquire's [`HolderId`] (the public hash of
//!   its lease token, laid out 8-4-4-4-12): unique to the acquire, so a
//!   create whose answer was lost is found again by its prefix, and
//!   derived from the token alone, so a held lease finds its node without
//!   state. It reveals nothing the token's holder id does not.
//! - Contenders are ordered by the last ten characters of their names, the
//!   sequence number ZooKeeper appends (every recipe's common part:
//!   Curator's `lock-0000000007`, kazoo's `__lock__0000000007`), whatever
//!   comes before it. A child whose name does not end in ten digits is no
//!   contender.

use leasehold::HolderId;

/// The bytes of a lock key kept as they are in its directory's name.
fn kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-_.:{}@=+,".contains(&byte)
}

/// The lock key `key` as one node name.
pub(crate) fn escape(key: &str) -> String {
    let dots_only = key.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        if kept(byte) && !(dots_only && byte == b'.') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The prefix of the contender node an acquire with holder id `holder`
/// creates: `_c_<uuid>-lock-`, ZooKeeper appending the sequence.
pub(crate) fn node_prefix(holder: &HolderId) -> String {
    let hex = holder.as_str();
    let part = |from: usize, to: usize| hex.get(from..to).unwrap_or_default();
    format!(
        "_c_{}-{}-{}-{}-{}-lock-",
        part(0, 8),
        part(8, 12),
        part(12, 16),
        part(16, 20),
        part(20, 32)
    )
}

/// The sequence number of the child `name`, if it is a contender (its
/// name ends in the ten digits ZooKeeper appends).
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    let start = name.len().checked_sub(10)?;
    let digits = name.get(start..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The contenders among `children`, lowest sequence first.
pub(crate) fn contenders(children: &[String]) -> Vec<(i64, &str)> {
    let mut found: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|name| sequence_of(name).map(|seq| (seq, name.as_str())))
        .collect();
    found.sort_unstable();
    found
}

/// What marks a node's data as a leader record of ours (Curator writes
/// its client's address there, kazoo its identifier).
const RECORD_MAGIC: &str = "leasehold-leader/1";

/// The data of a contender node that names its holder the leader of the
/// election whose record key is `record_key`: the marker, the record
/// key's length and the record key, then the body.
pub(crate) fn encode_record(record_key: &str, body: &str) -> Vec<u8> {
    format!("{RECORD_MAGIC} {}\n{record_key}{body}", record_key.len()).into_bytes()
}

/// The body of the leader record `record_key` in a contender node's
/// `data`, if the data is one (another election's record, a Curator
/// node's address and a node with no data are not).
pub(crate) fn decode_record(data: &[u8], record_key: &str) -> Option<String> {
    let text = std::str::from_utf8(data).ok()?;
    let rest = text.strip_prefix(RECORD_MAGIC)?.strip_prefix(' ')?;
    let (len, rest) = rest.split_once('\n')?;
    let len: usize = len.parse().ok()?;
    let (key, body) = (rest.get(..len)?, rest.get(len..)?);
    (key == record_key).then(|| body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_to_one_node_name() {
        assert_eq!(escape("lock:{account:alice}"), "lock:{account:alice}");
        assert_eq!(escape("a/b"), "a%2Fb");
        assert_eq!(escape("50%"), "50%25");
        assert_eq!(escape("é"), "%C3%A9");
        assert_eq!(escape("."), "%2E");
        assert_eq!(escape(".."), "%2E%2E");
        assert_eq!(escape("a.b"), "a.b");
        assert_ne!(escape("a/b"), escape("a%2Fb"));
    }

    #[test]
    fn contenders_are_ordered_by_the_sequence_whatever_the_prefix() {
        let children = [
            "_c_0b1e-lock-0000000012",
            "__lock__0000000003",
            "not-a-contender",
            "_c_ffff-lock-0000000007",
            "lock-00000001x",
        ]
        .map(String::from);
        let order: Vec<&str> = contenders(&children).into_iter().map(|(_, n)| n).collect();
        assert_eq!(
            order,
            [
                "__lock__0000000003",
                "_c_ffff-lock-0000000007",
                "_c_0b1e-lock-0000000012"
            ]
        );
    }

    #[test]
    fn the_prefix_is_curators_with_the_holder_id_as_uuid() {
        let holder = HolderId::parse("0123456789abcdef0123456789abcdef");
        let prefix = holder.as_ref().map(node_prefix);
        assert_eq!(
            prefix.as_deref(),
            Some("_c_01234567-89ab-cdef-0123-456789abcdef-lock-")
        );
    }

    #[test]
    fn a_record_reads_back_only_under_its_key() {
        let data = encode_record("leader:{x}", "7\nholder\na\nb");
        assert_eq!(
            decode_record(&data, "leader:{x}").as_deref(),
            Some("7\nholder\na\nb")
        );
        assert_eq!(decode_record(&data, "leader:{y}"), None);
        assert_eq!(decode_record(b"10.0.0.7", "leader:{x}"), None);
        assert_eq!(decode_record(b"", "leader:{x}"), None);
    }
}
