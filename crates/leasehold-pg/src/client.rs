//! tokio-postgres's side of the [`Statements`] seam: the guard's and
//! `setup`'s statements on a client or a transaction.

use tokio_postgres::GenericClient;

use crate::error::{Error, Result};
use crate::statements::{FENCE_OF, GUARD, Statements};

/// A tokio-postgres client or transaction, running this crate's statements.
pub(crate) struct OnClient<'a, C>(pub(crate) &'a C);

impl<C: GenericClient> Statements for OnClient<'_, C> {
    async fn guard(&mut self, resource: &str, fence: i64, holder: &str) -> Result<bool> {
        let row = self
            .0
            .query_opt(GUARD, &[&resource, &fence, &holder])
            .await
            .map_err(Error::from_pg)?;
        Ok(row.is_some())
    }

    async fn fence_of(&mut self, resource: &str) -> Result<(i64, Option<String>)> {
        let row = self
            .0
            .query_one(FENCE_OF, &[&resource])
            .await
            .map_err(Error::from_pg)?;
        Ok((
            row.try_get(0).map_err(Error::from_pg)?,
            row.try_get(1).map_err(Error::from_pg)?,
        ))
    }

    async fn flag(&mut self, sql: &'static str, arg: Option<&str>) -> Result<bool> {
        let row = match arg {
            Some(arg) => self.0.query_one(sql, &[&arg]).await,
            None => self.0.query_one(sql, &[]).await,
        }
        .map_err(Error::from_pg)?;
        row.try_get(0).map_err(Error::from_pg)
    }

    async fn batch(&mut self, sql: &'static str) -> Result<()> {
        self.0.batch_execute(sql).await.map_err(Error::from_pg)
    }
}
