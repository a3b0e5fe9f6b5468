//! Reads for the rollout pages (`http/pages.rs`).

use super::{Store, StoreError};

impl Store {
    /// The release that started rollout `id` as one of its targets, if any.
    pub async fn release_of_rollout(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> =
            sqlx::query_as("select release_id from release_target where rollout_id = ? limit 1")
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(|(r,)| r))
    }
}
