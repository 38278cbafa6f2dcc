//! [`FencingToken`] as a PostgreSQL `bigint` (feature `postgres`): binds
//! with `ToSql` and reads back with `FromSql` in tokio-postgres, so a
//! fenced write needs no cast.
//!
//! The range is checked both ways: a token above `i64::MAX` does not bind
//! (an error, never a wrapped negative number), and a `bigint` that is not
//! positive does not read as a token ([`TokenRange`]). Tokens Redis issues
//! stay below 2^53 ([`FencingToken::MAX`]), well inside.

use std::error::Error as StdError;

use bytes::BytesMut;
use postgres_types::{FromSql, IsNull, ToSql, Type, accepts, to_sql_checked};

use crate::fencing::FencingToken;

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for FencingToken {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        i64::try_from(*self)?.to_sql(ty, out)
    }

    accepts!(INT8);
    to_sql_checked!();
}

impl<'a> FromSql<'a> for FencingToken {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<FencingToken, BoxError> {
        Ok(FencingToken::try_from(i64::from_sql(ty, raw)?)?)
    }

    accepts!(INT8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_binds_and_reads_as_a_bigint_within_its_range() -> Result<(), BoxError> {
        let mut buf = BytesMut::new();
        FencingToken::new(42).to_sql_checked(&Type::INT8, &mut buf)?;
        assert_eq!(
            FencingToken::from_sql(&Type::INT8, &buf)?,
            FencingToken::new(42)
        );
        // Above bigint: an error, not a wrapped negative number.
        let mut big = BytesMut::new();
        assert!(
            FencingToken::new(u64::MAX)
                .to_sql_checked(&Type::INT8, &mut big)
                .is_err()
        );
        assert!(big.is_empty());
        // Not a token: 0 and negative numbers.
        for value in [0_i64, -5] {
            let mut raw = BytesMut::new();
            value.to_sql(&Type::INT8, &mut raw)?;
            assert!(
                FencingToken::from_sql(&Type::INT8, &raw).is_err(),
                "{value}"
            );
        }
        // Only bigint.
        assert!(!<FencingToken as ToSql>::accepts(&Type::INT4));
        assert!(!<FencingToken as FromSql>::accepts(&Type::TEXT));
        Ok(())
    }
}
