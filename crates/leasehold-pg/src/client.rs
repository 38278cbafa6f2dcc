//! tokio-postgres's side of the [`Statements`] seam: the guard's and
//! `setup`'s statements on a client or a transaction.

use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};

use crate::error::{Error, Result};
use crate::statements::{GUARD, GUARD_BOUNDED, Statements, TAKE_OVER, Verdict};

/// A tokio-postgres client or transaction, running this crate's statements.
pub(crate) struct OnClient<'a, C>(pub(crate) &'a C);

impl<C: GenericClient> Statements for OnClient<'_, C> {
    async fn guard(
        &mut self,
        resource: &str,
        fence: i64,
        holder: &str,
        idle_ms: Option<i64>,
    ) -> Result<Verdict> {
        // Typed: parse, bind and execute go out at once, with no prepare
        // first (one round trip), and they are sent when the future is
        // first polled, so a statement issued after it pipelines.
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&resource, Type::TEXT),
            (&fence, Type::INT8),
            (&holder, Type::TEXT),
        ];
        let row = match &idle_ms {
            None => self.0.query_typed_one(GUARD, &params).await,
            Some(idle_ms) => {
                let [resource, fence, holder] = params;
                self.0
                    .query_typed_one(
                        GUARD_BOUNDED,
                        &[resource, fence, holder, (idle_ms, Type::INT8)],
                    )
                    .await
            }
        }
        .map_err(Error::from_pg)?;
        Ok(Verdict {
            accepted: row.try_get(0).map_err(Error::from_pg)?,
            fence: row.try_get(1).map_err(Error::from_pg)?,
            holder: row.try_get(2).map_err(Error::from_pg)?,
        })
    }

    async fn flag(&mut self, sql: &'static str, args: &[&str]) -> Result<bool> {
        // Typed, as the guard: one round trip, no prepare first (a
        // guarded commit that checks its lease row pays one, not two).
        let params: Vec<(&(dyn ToSql + Sync), Type)> = args
            .iter()
            .map(|arg| (arg as &(dyn ToSql + Sync), Type::TEXT))
            .collect();
        let row = self
            .0
            .query_typed_one(sql, &params)
            .await
            .map_err(Error::from_pg)?;
        row.try_get(0).map_err(Error::from_pg)
    }

    async fn batch(&mut self, sql: &str) -> Result<()> {
        self.0.batch_execute(sql).await.map_err(Error::from_pg)
    }

    async fn take_over(&mut self, resource: &str, fence: i64, holder: &str) -> Result<bool> {
        let row = self
            .0
            .query_typed_one(
                TAKE_OVER,
                &[
                    (&resource, Type::TEXT),
                    (&fence, Type::INT8),
                    (&holder, Type::TEXT),
                ],
            )
            .await
            .map_err(Error::from_pg)?;
        row.try_get(0).map_err(Error::from_pg)
    }
}
