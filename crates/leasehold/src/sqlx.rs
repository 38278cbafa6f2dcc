//! [`FencingToken`] as a PostgreSQL `INT8` (`bigint`) in sqlx 0.8 (feature
//! `sqlx`): `Type`, `Encode` and `Decode` for `Postgres`, so a fenced write
//! binds the token as it is: `.bind(token)`, `row.try_get::<FencingToken,
//! _>("fence")`.
//!
//! The range is checked both ways, as for tokio-postgres: a token above
//! `i64::MAX` does not bind (the query fails with sqlx's encode error
//! before anything is sent; never a wrapped negative number), and a
//! `bigint` that is not positive does not decode as a token
//! ([`TokenRange`](crate::TokenRange)). `INT8` only. Tokens Redis issues
//! stay below 2^53 ([`FencingToken::MAX`]), well inside.

use sqlx_core::decode::Decode;
use sqlx_core::encode::{Encode, IsNull};
use sqlx_core::error::BoxDynError;
use sqlx_core::types::Type;
use sqlx_postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};

use crate::fencing::FencingToken;

impl Type<Postgres> for FencingToken {
    fn type_info() -> PgTypeInfo {
        <i64 as Type<Postgres>>::type_info()
    }
}

impl PgHasArrayType for FencingToken {
    fn array_type_info() -> PgTypeInfo {
        <i64 as PgHasArrayType>::array_type_info()
    }
}

impl Encode<'_, Postgres> for FencingToken {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<'_, Postgres>>::encode_by_ref(&i64::try_from(*self)?, buf)
    }

    fn size_hint(&self) -> usize {
        std::mem::size_of::<i64>()
    }
}

impl Decode<'_, Postgres> for FencingToken {
    fn decode(value: PgValueRef<'_>) -> Result<FencingToken, BoxDynError> {
        Ok(FencingToken::try_from(
            <i64 as Decode<'_, Postgres>>::decode(value)?,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_encodes_as_an_int8_within_its_range() -> Result<(), BoxDynError> {
        let mut buf = PgArgumentBuffer::default();
        let written = FencingToken::new(42).encode_by_ref(&mut buf)?;
        assert!(matches!(written, IsNull::No));
        assert_eq!(&buf[..], &42_i64.to_be_bytes());
        // Above bigint: an error, not a wrapped negative number, and
        // nothing written.
        let mut big = PgArgumentBuffer::default();
        assert!(FencingToken::new(u64::MAX).encode_by_ref(&mut big).is_err());
        assert!(big.is_empty());
        // INT8 only.
        assert!(<FencingToken as Type<Postgres>>::compatible(
            &<i64 as Type<Postgres>>::type_info()
        ));
        for other in [
            <i32 as Type<Postgres>>::type_info(),
            <String as Type<Postgres>>::type_info(),
            <f64 as Type<Postgres>>::type_info(),
        ] {
            assert!(!<FencingToken as Type<Postgres>>::compatible(&other));
        }
        Ok(())
    }
}
