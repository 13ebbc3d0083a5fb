//! Why the agent could not carry on: a store error or a local state error, each
//! classified so that callers branch on kinds.

use jio_common::store::{ErrorKind, StoreError};

use crate::state::StateError;

/// Why a pass (or the agent's start) could not carry on.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    State(#[from] StateError),
}

impl AgentError {
    pub fn store_unavailable(&self) -> bool {
        matches!(self, AgentError::Store(e) if e.kind() == ErrorKind::Unavailable)
    }
}
